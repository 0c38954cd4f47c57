"""Doctored results with every label (and hostile text) that the report, summary, gate and
expectations tests share, plus a small HTML reader; the tests here check the data itself."""
from __future__ import annotations

from html.parser import HTMLParser

from cases.model import Case, Shape, Variant
from records.results import Label, Record, RunResults, load_results, write_results

HOSTILE = "<script>alert(1)</script> & \"double\" 'single' </pre><b>bold</b>"
#: A case id that follows no known form, made to break out of an attribute if unescaped.
ODD_ID = 'odd"><img src=x onerror=alert(2)>'


def case_id(variant: str = "causal", batch: int = 1, seq: int = 128, dtype: str = "bf16",
            params: tuple = ()) -> str:
    return Case(Variant(variant, params), Shape(batch, 8, 8, seq, seq, 128), dtype, "fwd").id


def record(cid: str, label: Label = Label.PASS, compile_seconds: float | None = 4.0,
           message: str = "", metrics: dict | None = None, cache_hit: bool | None = False,
           ) -> Record:
    return Record(case_id=cid, label=label, message=message, compile_seconds=compile_seconds,
                  run_seconds=0.01, cache_hit=cache_hit, metrics=metrics, worker="gw0")


def run(records: list[Record], backend: str = "neuron", profile: str = "smoke",
        compile_cache: str = "cold", seed: int = 0, suite_version: str = "0.1.0",
        complete: bool = True) -> RunResults:
    return RunResults(
        environment={"backend": backend, "device": "trn3 <fake>", "torch": "2.13.0",
                     "neuronx_cc": "2.21 & co", "host": "host-1"},
        options={"backend": backend, "profile": profile, "seed": seed,
                 "compile_timeout": 600.0, "run_timeout": 120.0,
                 "compile_cache": compile_cache},
        records=tuple(records), suite_version=suite_version, complete=complete)


#: One case per label; the MISMATCH one carries the hostile message and every metric.
LABEL_CASES = {label: case_id(variant, batch, seq) for label, (variant, batch, seq) in zip(
    Label, [(v, b, s) for v in ("causal", "full", "alibi", "softcap")
            for b in (1, 2) for s in (128, 256)])}
MISMATCH_METRICS = {
    "error_ratio": 3.25, "max_abs_err": 0.5, "mean_abs_err": 0.01,
    "baseline_mean_abs_err": 0.003, "worst_row_ratio": 40.0, "worst_head_ratio": 2.0,
    "worst_place": {"b": 0, "h": 3, "q": 17}, "nan_count": 2, "inf_count": 0,
    "failed_rules": ["global", "row"], "custom_extra": "x<y",
}


def doctored_run(**kwargs) -> RunResults:
    """Every label once, a case with an id of no known form, and a hostile message."""
    records = []
    for label, cid in LABEL_CASES.items():
        records.append(record(
            cid, label,
            compile_seconds=None if label is Label.COMPILE_TIMEOUT else 4.0,
            message=HOSTILE if label is Label.MISMATCH else f"{label.value} happened",
            metrics=MISMATCH_METRICS if label is Label.MISMATCH else None))
    records.append(record(ODD_ID, Label.PASS, compile_seconds=0.02))
    return run(records, **kwargs)


class Page(HTMLParser):
    """Start tags with attributes, and text chunks (entities decoded), of an HTML page."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.texts: list[str] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data):
        self.texts.append(data)

    def find(self, tag: str, **attrs: str) -> list[dict[str, str]]:
        return [a for t, a in self.tags
                if t == tag and all(a.get(k.rstrip("_")) == v for k, v in attrs.items())]

    def ids(self) -> set[str]:
        return {a["id"] for _, a in self.tags if "id" in a}


def test_doctored_run_has_every_label_once_and_is_a_valid_results_file(tmp_path):
    results = doctored_run()
    labels = [r.label for r in results.records if r.case_id != ODD_ID]
    assert sorted(labels) == sorted(Label)
    write_results(results, tmp_path / "results.json")
    assert load_results(tmp_path / "results.json") == results


def test_page_reader_decodes_entities_and_keeps_attributes():
    page = Page('<p id="a&quot;b">x &lt;y&gt; &amp; z</p>')
    assert page.ids() == {'a"b'}
    assert "".join(page.texts) == "x <y> & z"
