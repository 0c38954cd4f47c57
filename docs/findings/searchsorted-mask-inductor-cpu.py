"""Finding 14 (docs/findings.md): a mask_mod that finds each index's document with
torch.searchsorted runs in eager flex_attention and fails to compile on the CPU
(Inductor: PendingUnbackedSymbolNotFound). Torch only; run with any torch >= 2.6:
    python docs/findings/searchsorted-mask-inductor-cpu.py
"""
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

S = 128
boundaries = torch.tensor([0, 40, 90, S])  # three packed documents: 40, 50 and 38 tokens


def document_causal(b, h, q_idx, kv_idx):
    same = (torch.searchsorted(boundaries, q_idx, right=True)
            == torch.searchsorted(boundaries, kv_idx, right=True))
    return same & (q_idx >= kv_idx)


def main() -> None:
    print(f"torch {torch.__version__}")
    block_mask = create_block_mask(document_causal, None, None, S, S, device="cpu")
    q, k, v = (torch.randn(1, 2, S, 16, generator=torch.Generator().manual_seed(i))
               for i in range(3))
    eager = flex_attention(q, k, v, block_mask=block_mask)
    print("eager   : ok")
    try:
        compiled = torch.compile(flex_attention, fullgraph=True)(q, k, v, block_mask=block_mask)
        print(f"compiled: ok, max |compiled - eager| = {float((compiled - eager).abs().max()):.3g}")
    except Exception as exc:  # noqa: BLE001 - what torch raises is the finding
        print(f"compiled: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")


if __name__ == "__main__":
    main()
