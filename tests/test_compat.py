"""conformance.compat on the torch at hand (2.13 here) and on stand-ins of older signatures.

The running torch checks the newer generation of the API (return_aux, create_block_mask with
device=None); functions with torch 2.6's signatures (return_lse only, device='cuda' default)
check the older one, since only one torch is installed here.
"""
from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from conformance import compat


def _qkv(hq=2, hkv=2, s=64, d=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(1, hq, s, d, generator=gen), torch.randn(1, hkv, s, d, generator=gen),
            torch.randn(1, hkv, s, d, generator=gen))


def _dense(q, k, v, causal=False):
    """Float64 attention and its log-sum-exp, written out (kv heads repeated for GQA)."""
    q, k, v = (t.double() for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = scores.shape[-1]
        scores = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), -math.inf)
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


# A flex_attention with torch 2.6's signature: return_lse, no return_aux.
def flex_attention_2_6(query, key, value, score_mod=None, block_mask=None, scale=None,
                       enable_gqa=False, return_lse=False, kernel_options=None):
    flex_attention_2_6.calls.append({"return_lse": return_lse})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return flex_attention(query, key, value, score_mod, block_mask, scale, enable_gqa,
                              return_lse=return_lse)


# A future flex_attention without return_lse (announced for removal).
def flex_attention_aux_only(query, key, value, score_mod=None, block_mask=None, scale=None,
                            enable_gqa=False, kernel_options=None, *, return_aux=None):
    return flex_attention(query, key, value, score_mod, block_mask, scale, enable_gqa,
                          return_aux=return_aux)


# create_block_mask as in torch 2.6: the device defaults to "cuda".
def create_block_mask_2_6(mask_mod, B, H, Q_LEN, KV_LEN, device="cuda", BLOCK_SIZE=128,
                          _compile=False):
    return create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=device, BLOCK_SIZE=BLOCK_SIZE)


def test_torch_version_and_minimum():
    assert compat.torch_version("2.13.0+cpu") == (2, 13)
    assert compat.torch_version("2.6.0a0+git1234") == (2, 6)
    compat.require_supported_torch("2.6.0")
    compat.require_supported_torch()  # the torch at hand
    with pytest.raises(RuntimeError, match=r"torch 2\.5\.1 is too old .* install torch>=2\.6"):
        compat.require_supported_torch("2.5.1")
    with pytest.raises(ValueError, match="cannot read a torch version from 'nightly'"):
        compat.torch_version("nightly")


def test_running_torch_has_return_aux():
    api = compat.flex_api()
    assert api.lse_via_aux and api.lse_via_flag  # 2.13: both, return_lse deprecated
    assert compat.flex_api(flex_attention_2_6) == compat.FlexApi(lse_via_aux=False, lse_via_flag=True)


def test_lse_on_running_torch_without_deprecation_warning():
    q, k, v = _qkv()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # return_lse would warn on 2.13
        out, lse = compat.attention(flex_attention, q, k, v, return_lse=True)
    want_out, want_lse = _dense(q, k, v)
    torch.testing.assert_close(out.double(), want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fn", [flex_attention_2_6, flex_attention_aux_only],
                         ids=["torch-2.6-return_lse", "aux-only"])
def test_lse_on_either_api_generation(fn):
    flex_attention_2_6.calls = []
    q, k, v = _qkv(seed=1)
    out, lse = compat.attention(fn, q, k, v, return_lse=True, api=compat.flex_api(fn))
    want_out, want_lse = _dense(q, k, v)
    torch.testing.assert_close(out.double(), want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)
    if fn is flex_attention_2_6:
        assert flex_attention_2_6.calls == [{"return_lse": True}]


def test_output_only_and_gqa():
    q, k, v = _qkv(hq=4, hkv=2, seed=2)
    out = compat.attention(flex_attention, q, k, v, enable_gqa=True)
    torch.testing.assert_close(out.double(), _dense(q, k, v)[0], atol=1e-5, rtol=1e-5)


def test_block_mask_always_passes_the_device():
    q, k, v = _qkv(s=256, seed=3)
    # torch 2.6's default device is "cuda": without an explicit device this fails on a CPU box
    mask = compat.block_mask(_causal, None, None, 256, 256, "cpu", create=create_block_mask_2_6,
                             BLOCK_SIZE=128)
    assert mask.kv_num_blocks.device.type == "cpu"
    out = compat.attention(flex_attention, q, k, v, block_mask=mask)
    torch.testing.assert_close(out.double(), _dense(q, k, v, causal=True)[0], atol=1e-5, rtol=1e-5)
    running = compat.block_mask(_causal, None, None, 256, 256, "cpu")
    assert torch.equal(running.to_dense(), mask.to_dense())


def test_block_mask_refuses_a_keyword_the_version_lacks():
    with pytest.raises(TypeError, match="has no parameter 'separate_full_blocks'; drop it"):
        compat.block_mask(_causal, None, None, 128, 128, "cpu", create=create_block_mask_2_6,
                          separate_full_blocks=False)


def _upstream_rejection(device: str) -> str:
    q = torch.randn(1, 1, 16, 16, device=device)
    with pytest.raises(ValueError) as info:
        flex_attention(q, q, q)
    return str(info.value)


def test_validate_device_raises_upstreams_exact_error():
    expected = _upstream_rejection("meta")
    assert expected.startswith(compat.UNSUPPORTED_DEVICE_PREFIX)
    q = torch.randn(1, 1, 16, 16, device="meta")
    with pytest.raises(ValueError) as info:
        compat.validate_device(q, q, q)
    assert str(info.value) == expected
    cpu = torch.randn(1, 1, 16, 16)
    compat.validate_device(cpu, cpu, cpu)  # supported: nothing raised


def test_exact_message_recovered_from_dynamo_wrapping():
    expected = _upstream_rejection("meta")
    q = torch.randn(1, 1, 16, 16, device="meta")
    torch._dynamo.reset()
    compiled = torch.compile(flex_attention, backend=lambda gm, inputs: gm.forward,
                             fullgraph=True, dynamic=False)
    with pytest.raises(Exception) as info:
        compiled(q, q, q)
    assert not str(info.value).startswith(compat.UNSUPPORTED_DEVICE_PREFIX)  # wrapped on 2.13
    assert compat.unsupported_device_message(info.value) == expected
    torch._dynamo.reset()


def test_exact_message_of_older_wordings_and_none_otherwise():
    old = "FlexAttention is only supported on CUDA or CPU devices. Found input tensors on xla device."
    wrapped = RuntimeError("backend='neuron' raised:\nValueError('" + old + "')")
    assert compat.unsupported_device_message(wrapped) == old
    try:
        try:
            raise ValueError(old)
        except ValueError as inner:
            raise RuntimeError("compile failed") from inner
    except RuntimeError as outer:
        assert compat.unsupported_device_message(outer) == old
    assert compat.unsupported_device_message(RuntimeError("CUDA error: illegal address")) is None


def test_only_whole_upstream_sentences_are_unsupported():
    backward = ("FlexAttention does not support backward on CPU. Please set the input "
                "requires_grad to False or use another device.")
    wrapped = RuntimeError(f"Observed exception ... raised exception NotImplementedError('{backward}')")
    assert compat.unsupported_sentence(wrapped) == backward
    lse = "torch.compile on CPU only supports inference and `return_lse` is not supported yet."
    assert compat.unsupported_sentence(RuntimeError(f"LoweringException: NotImplementedError: {lse}")) == lse
    for look_alike in ("NKI kernel does not support backward on trn2 for bf16",
                       "our lowering says `return_lse` is not supported yet"):
        assert compat.unsupported_sentence(RuntimeError(look_alike)) is None
    try:  # an error raised while handling a device rejection is its own error
        try:
            raise ValueError("FlexAttention is only supported on CUDA or CPU devices. "
                             "Found input tensors on xla device.")
        except ValueError:
            raise RuntimeError("neuronx-cc: internal compiler error")
    except RuntimeError as err:
        assert compat.unsupported_sentence(err) is None


class _Metrics:
    def __init__(self, **fields):
        self.__dict__.update(fields)


_NEW = dict(dynamo_cumulative_compile_time_us=10_000_000,
            aot_autograd_cumulative_compile_time_us=9_000_000,
            inductor_cumulative_compile_time_us=8_000_000,
            inductor_code_gen_cumulative_compile_time_us=3_000_000)


@pytest.mark.parametrize("threads, entries, timed, expected", [
    # a pool of compile workers: the wait for them is the kernel compile, inside codegen; two
    # compilations (a backward case) add up
    (4, [_Metrics(**_NEW, triton_compile_time_us=2_500_000),
      _Metrics(dynamo_cumulative_compile_time_us=1_000_000)],
     {"compile_file": [3.0, 3.0]},  # threads of the pool: overlapping, not counted
     {"dynamo_tracing": 2.0, "aot_autograd": 1.0, "inductor_lowering": 5.0,
      "inductor_codegen": 0.5, "cxx_compile": 2.5}),
    # one compile thread: compile_file regions in process, 2 s of them in the module's load;
    # torch 2.6 times a short wait there too (it took them for a pool's: cxx_compile 0.0004 s)
    *((1, [_Metrics(**_NEW, triton_compile_time_us=wait)],
       {"compile_file": [1.5, 2.5, 1.0], "PyCodeCache.load_by_key_path": [2.0]},
       {"dynamo_tracing": 1.0, "aot_autograd": 1.0, "inductor_lowering": 2.0,
        "inductor_codegen": 1.0, "cxx_compile": 5.0}) for wait in (None, 373)),
    # older torch: seconds, no kernel-compile timer (compiles stay where they happen)
    (1, [_Metrics(entire_frame_compile_time_s=4.0, backend_compile_time_s=3.0,
               inductor_compile_time_s=2.5, code_gen_time_s=1.0)], {},
     {"dynamo_tracing": 1.0, "aot_autograd": 0.5, "inductor_lowering": 1.5,
      "inductor_codegen": 1.0}),
    (1, [], {}, None),
])
def test_inductor_compile_stages_from_torchs_metrics(monkeypatch, threads, entries, timed,
                                                     expected):
    from torch._dynamo import utils
    from torch._inductor import async_compile

    monkeypatch.setattr(async_compile, "get_compile_threads", lambda: threads)
    monkeypatch.setattr(utils, "get_compilation_metrics", lambda: entries)
    monkeypatch.setattr(utils, "compilation_time_metrics", timed)
    stages = compat.inductor_compile_stages("cxx_compile")
    assert stages == (pytest.approx(expected) if expected else None)
    if expected:  # the stages never overlap: they sum to the frame
        assert sum(stages.values()) == pytest.approx(
            sum(getattr(e, "dynamo_cumulative_compile_time_us", 0) or 0 for e in entries) / 1e6
            or entries[0].entire_frame_compile_time_s)


def test_triton_compiles_in_one_thread_are_their_own_stage(monkeypatch):
    """CUDA, as the suite runs it (one compile thread): Inductor compiles each Triton kernel in
    process, timed as ``async_compile.precompile`` (torch 2.13 async_compile.py), as the
    generated module loads in code generation. Without that region the breakdown had no
    ``triton_compile`` and put all of it in ``inductor_codegen`` (an outside review)."""
    from torch._dynamo import utils
    from torch._inductor import async_compile

    monkeypatch.setattr(async_compile, "get_compile_threads", lambda: 1)
    metrics = {**_NEW, "inductor_code_gen_cumulative_compile_time_us": 6_000_000}
    monkeypatch.setattr(utils, "get_compilation_metrics",
                        lambda: [_Metrics(**metrics, triton_compile_time_us=5_000_000)])
    monkeypatch.setattr(utils, "compilation_time_metrics",
                        {"async_compile.precompile": [4.0, 1.0],
                         "PyCodeCache.load_by_key_path": [5.5]})
    stages = compat.inductor_compile_stages("triton_compile")
    assert stages == pytest.approx({"dynamo_tracing": 1.0, "aot_autograd": 1.0,
                                    "inductor_lowering": 2.0, "inductor_codegen": 0.5,
                                    "triton_compile": 5.5})


def test_torchs_structured_trace_reaches_a_capture_only_when_torch_writes_a_trace(tmp_path):
    """pytest >= 9 attaches its log capture to torch's never-propagating trace logger: without
    the filter every failing case showed dozens of empty DEBUG lines from a make_fx trace (the
    mask's dependence was traced so then; torch.compile traces so). With TORCH_TRACE (torch's
    own handler has a directory) the records still flow."""
    import logging

    from torch._logging._internal import LazyTraceHandler

    from torch.fx.experimental.proxy_tensor import make_fx

    from conformance.compat import TORCH_TRACE_LOGGER, keep_torch_trace_to_itself

    trace_log = logging.getLogger(TORCH_TRACE_LOGGER)
    captured: list[logging.LogRecord] = []
    causal = lambda b, h, q_idx, kv_idx: q_idx >= kv_idx  # noqa: E731
    index = [torch.zeros((), dtype=torch.int64) for _ in range(4)]

    class Capture(logging.Handler):  # what pytest's capture handler is to the logger
        def emit(self, record):
            captured.append(record)

    capture, writer = Capture(), LazyTraceHandler(str(tmp_path))
    trace_log.addHandler(capture)
    try:
        keep_torch_trace_to_itself()
        keep_torch_trace_to_itself()  # idempotent: one filter
        assert sum(type(f).__name__ == "_TorchTraceWritesSomewhere" for f in trace_log.filters) == 1
        make_fx(causal, tracing_mode="fake")(*index)
        assert captured == []
        trace_log.addHandler(writer)  # as TORCH_TRACE=DIR sets it up
        make_fx(causal, tracing_mode="fake")(*index)
        assert captured and list(tmp_path.iterdir())  # the trace is written, and seen
    finally:
        trace_log.removeHandler(capture)
        trace_log.removeHandler(writer)
        writer.close()


def test_graph_caches_off_within_and_set_back_after_even_on_an_error():
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    before = (inductor_config.fx_graph_cache, functorch_config.enable_autograd_cache)
    inductor_config.fx_graph_cache = True  # a value to set back that the default may not be
    try:
        with pytest.raises(KeyError):
            with compat.graph_caches_off():
                assert inductor_config.fx_graph_cache is False
                assert functorch_config.enable_autograd_cache is False
                raise KeyError("inside")
        assert inductor_config.fx_graph_cache is True
        assert functorch_config.enable_autograd_cache is before[1]
    finally:
        inductor_config.fx_graph_cache, functorch_config.enable_autograd_cache = before


def test_graph_caches_off_says_so_where_an_environment_variable_forces_one_on():
    """TORCHINDUCTOR_FX_GRAPH_CACHE=1 wins over code (torch's config): the warm-up must know,
    or a kept build directory would cache whole graphs and skip its stages."""
    import os
    import subprocess
    import sys

    code = ("from conformance import compat\n"
            "with compat.graph_caches_off() as off:\n"
            "    print(off)\n")
    for forced, expected in (({"TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}, "False"),
                             ({"TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}, "False")):
        env = {k: v for k, v in os.environ.items() if not k.endswith("_CACHE")} | forced
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, check=True, cwd=os.path.dirname(os.path.dirname(
                                 os.path.abspath(__file__)))).stdout.split()
        assert out == [expected], (forced, out)


def test_inductor_caches_are_cleared_under_either_name(monkeypatch):
    """torch 2.6 and 2.7 name it clear_inductor_caches, newer torch clear_caches: a cold case
    must start from cleared in-memory caches on both (docs/execution.md)."""
    from torch._inductor import utils

    called = []
    monkeypatch.delattr(utils, "clear_caches", raising=False)
    monkeypatch.setattr(utils, "clear_inductor_caches", lambda: called.append("older"),
                        raising=False)
    assert compat.clear_inductor_caches() and called == ["older"]
    monkeypatch.setattr(utils, "clear_caches", lambda: called.append("newer"), raising=False)
    assert compat.clear_inductor_caches() and called == ["older", "newer"]
    monkeypatch.delattr(utils, "clear_caches")
    monkeypatch.delattr(utils, "clear_inductor_caches")
    assert compat.clear_inductor_caches() is False
