"""Finding 2, second form: compiled CPU flex_attention crashes the process (SIGSEGV, or glibc's
"double free or corruption") on a score_mod that reads a padding mask the way Hugging Face's
4-D additive masks are laid out, ``mask[b][0][q_idx][kv_idx]`` on a [B, 1, S, S] float32 table.
The same read written ``mask[b, 0, q_idx, kv_idx]`` compiles and is right; eager is right.

Each form runs in a child process, so this script reports a crash instead of dying of it.
Torch only; CPU; a few seconds a form (the compile).

    python docs/findings/chained-index-inductor-cpu-crash.py
"""
import signal
import subprocess
import sys

FORMS = {
    "chained m[b][0][q][kv]": lambda m, b, q, kv: m[b][0][q][kv],
    "partly  m[b, 0][q][kv]": lambda m, b, q, kv: m[b, 0][q][kv],
    "partly  m[b][0][q, kv]": lambda m, b, q, kv: m[b][0][q, kv],
    "flat    m[b, 0, q, kv]": lambda m, b, q, kv: m[b, 0, q, kv],
}


def run_one(form: str) -> None:
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    B, H, S, D = 2, 4, 160, 32
    torch.manual_seed(0)
    mask = torch.zeros(B, 1, S, S)
    mask.masked_fill_(torch.ones(S, S, dtype=torch.bool).triu(1), torch.finfo(torch.float32).min)
    read = FORMS[form]

    def padded(score, b, h, q_idx, kv_idx):
        return score + read(mask, b, q_idx, kv_idx)

    q, k, v = (torch.randn(B, H, S, D) for _ in range(3))
    eager = flex_attention(q, k, v, score_mod=padded)
    compiled = torch.compile(flex_attention, fullgraph=True)(q, k, v, score_mod=padded)
    qd, kd, vd = q.double(), k.double(), v.double()
    scores = qd @ kd.transpose(-1, -2) / D ** 0.5 + mask.double()
    reference = torch.softmax(scores, dim=-1) @ vd
    print(f"eager {(eager.double() - reference).abs().max().item():.3g}, "
          f"compiled {(compiled.double() - reference).abs().max().item():.3g}")


def main() -> None:
    import torch
    print(f"torch {torch.__version__}; max |out - float64 reference|:")
    for form in FORMS:
        child = subprocess.run([sys.executable, __file__, form], capture_output=True, text=True)
        if child.returncode == 0:
            result = child.stdout.strip().splitlines()[-1]
        elif child.returncode < 0:
            result = f"CRASHED: {signal.Signals(-child.returncode).name}"
        else:
            last = (child.stderr.strip().splitlines() or ["?"])[-1]
            result = f"exit {child.returncode}: {last[:100]}"
        print(f"  {form}: {result}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        run_one(sys.argv[1])
    else:
        main()
