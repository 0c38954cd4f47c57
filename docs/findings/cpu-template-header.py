"""docs/findings.md, finding 12: what torch 2.15.0's CPU flex_attention template adds to the C++
compile of every kernel it generates. Its INIT_PARAMS includes <ATen/cpu/Utils.h> (for
at::cpu::init_amx(), its AMX check), which 2.14's does not; this compiles the template's own
includes with and without that one, twice each, with the main flags of Inductor's own compile
(g++ -std=c++20 -O3 -march=native) and torch's include paths, and prints the seconds of each
compile. torch and g++ only.

    python docs/findings/cpu-template-header.py
"""
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import include_paths

INCLUDES = ["torch/csrc/inductor/cpp_prefix.h", "ATen/native/cpu/utils.h",
            "ATen/native/CPUBlas.h", "ATen/Context.h"]
ADDED = "ATen/cpu/Utils.h"

template = Path(torch.__file__).parent / "_inductor" / "codegen" / "cpp_flex_attention_template.py"
print("torch", torch.__version__, "- its CPU flex_attention template includes", ADDED, ":",
      f"#include <{ADDED}>" in template.read_text())
flags = ["-std=c++20", "-O3", "-DNDEBUG", "-march=native", "-fPIC", "-fopenmp", "-c",
         f"-I{sysconfig.get_paths()['include']}", *(f"-I{p}" for p in include_paths())]
with tempfile.TemporaryDirectory() as tmp:
    for name, headers in (("without", INCLUDES), ("with", [*INCLUDES, ADDED])):
        source = Path(tmp, f"{name}.cpp")
        source.write_text("".join(f"#include <{h}>\n" for h in headers) + "int f() { return 1; }\n")
        for _ in range(2):
            start = time.perf_counter()
            subprocess.run(["g++", str(source), *flags, "-o", str(source.with_suffix(".o"))],
                           check=True)
            print(f"  {name:8s} {ADDED}: {time.perf_counter() - start:.2f} s")
