"""The user docs stay pages a user reads: none over 300 lines (measurement history belongs in
commit messages; current figures in docs/PERFORMANCE.md)."""
import pathlib

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"


def test_no_docs_page_is_over_300_lines():
    pages = {p.name: len(p.read_text().splitlines()) for p in DOCS.glob("*.md")}
    assert len(pages) >= 10
    assert {name: n for name, n in pages.items() if n > 300} == {}
