"""Paper figures are transcribed as the papers print them (issue 34).

What is checked, against the paper texts in ../shared/papers:
- every number under a grid's `paper:` key (configs/grid/*.yaml); the grid names its paper by the first author in
  `paper_note` ("Jung et al.", ...); the number must be one the paper prints, in one of its spellings (below);
- every paper figure a script can find in the prose of README.md, results/*.md and docs/*.md:
  - "the paper's X", "the papers' X", "paper: X", "paper X" and "prints X", where X is a number or a list or range
    of numbers ("0.6105 to 0.9178 and 0.8372", "0.32-0.53", "1e-5 / 5e-5"); up to three words may stand between
    "the paper's" / "prints" and the number ("the paper's TK loses 17 %"), unless one of them makes the number a
    reference or our own figure (NOT_A_FIGURE: "the paper's Table 2", "the paper's way -6.6 %");
  - markdown tables: every number in a column whose header starts with "paper", and in a row whose first cell
    starts with "↳ paper" (the grid tables' paper rows).
  A record or doc is checked against the paper its file name or title names (PAPER_KEYWORDS); one that names none
  against all five.

Spellings of a number that count as the paper's (the normaliser): the same value whatever the trailing zeros or a
leading "0" (0.5530 = 0.553 = .553); the sign is not compared (prose writes "falls 9.4 %" for "-9.4%"); a fraction
for a percentage and back (0.63 for 63 %, 59.04 for 0.5904: a number <= 1 may be a percentage's fraction, a number
<= 100 a percentage); scientific notation as the papers write it (1e-5, the DGRe OCR's "1e—5" and "le—2", LaTeX's
"7*10^{-6}"; never rescaled); thousands commas. The DGRe text is an OCR of the PDF that lost decimal points: there
a number also matches an OCR token with the same digits (0.3123 in "03123", 54.24 in "5424", 0.4 in "04"). Prose
and tables may round: a quote with k decimals matches a paper value that rounds to it at k decimals (0.61 for
0.6105). Grid values may not: they are transcriptions and must match exactly.

The check is of occurrence, not of context: a quote passes if the paper prints the number anywhere ("the paper's TK
loses 17 %" passed, from Table 3's recall -17.1 %, though its nDCG@10 Delta is -20.8 %). Reading stays the check of
what a figure stands for.

Errata (records are never edited in silence, results/README.md): text from a record's first "## Erratum" heading on
is checked like the rest, except what stands in double quotes there: those are the quoted wrong figures. A quote in
the record's body that an erratum repeats verbatim inside double quotes is the corrected one and is not checked
again. Docs have no errata: they are corrected.

The papers folder is absent: skipped, but a failure in CI (env CI=true), as for ../shared/data
(conftest.require_shared). Standard library and PyYAML only.
"""

from __future__ import annotations

import bisect
import re
import sys
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import cache
from pathlib import Path

import pytest
import yaml
from conftest import REPO, require_shared

PAPERS = (REPO.parent / "shared" / "papers").resolve()
PAPER_FILES = {
    "dgre": "dgre-disentangled-graph-ranking.txt",
    "isotropy": "isotropic-representation-dense-retrieval.txt",
    "position_bias": "position-bias-passage-reranking.txt",
    "whitebox": "white-box-analysis-colbert.txt",
    "vocab": "vocabulary-projections-dense-retrieval.md",
}
OCR_LOST_POINTS = {"dgre"}  # the DGRe text is an OCR of the PDF: some decimal points are lost ("03123")
# a grid's paper_note starts with the paper's first author
GRID_AUTHORS = {
    "Liu et al.": "dgre",
    "Jung et al.": "isotropy",
    "Hofstätter et al.": "position_bias",
    "Formal et al.": "whitebox",
    "Ram et al.": "vocab",
}
# a record or doc names its paper in its file name or title (first line); several matches: any of them
PAPER_KEYWORDS = {
    "dgre": ("dgre",),
    "isotropy": ("isotropy", "heads", "whitening", "paper-protocol"),
    "position_bias": ("position-bias", "position bias", "transfer", "ats-", "answer-positions"),
    "whitebox": ("whitebox", "white-box", "formal et al"),
    "vocab": ("vocab", "lexical-enrichment", "mlm-head"),
}

# a number as written: optional sign, digits (thousands commas), decimals or a bare ".5904", scientific notation
_NUM = r"[-+−~]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?:e-?\d+)?(?:\s?%)?"
_SEP = r"(?:\s?/\s?|,\s|\s(?:and|to|or|->)\s|-|–)"
_NUMLIST = rf"{_NUM}(?:{_SEP}{_NUM})*"
_WORDS = r"(?:[A-Za-z][A-Za-z@_-]*\s+){0,3}"
QUOTE = re.compile(
    rf"(?:\b[Tt]he\s+papers?(?:'s|')\s+{_WORDS}|\b[Pp]aper:?\s+|\bprints\s+{_WORDS})(?P<nums>{_NUMLIST})"
)
# words after "the paper's" that make the number a reference or our own figure computed the paper's way, not a
# figure the paper prints ("the paper's Table 2", "the paper's test ... seeds 2-3", "the paper's protocol 0.76")
NOT_A_FIGURE = {
    "table",
    "tables",
    "figure",
    "figures",
    "fig",
    "eq",
    "equation",
    "equations",
    "section",
    "sections",
    "issue",
    "seed",
    "seeds",
    "way",
    "protocol",
    "protocols",
    "test",
    "tests",
    "conventions",
    "setting",
    "settings",
    "formula",
    "reading",
    "definition",
    "layout",
    "order",
}
NUMBER = re.compile(_NUM)


def require_papers() -> None:
    """Missing paper texts: skipped, naming them; a failure in CI (CI=true), as for ../shared/data."""
    require_shared(PAPERS, tuple(PAPER_FILES.values()), what="paper texts")


# ---------------------------------------------------------------------------------------------------------------
# the normaliser


def parse_number(text: str) -> tuple[Decimal, int] | None:
    """(absolute value, decimals as written) of a number token as our files write it; None if it is not one."""
    t = text.strip().rstrip("%").strip().lstrip("-+−~").replace(",", "")
    try:
        value = abs(Decimal(t))
    except InvalidOperation:
        return None
    decimals = len(t.split("e")[0].split(".")[1]) if "." in t.split("e")[0] else 0
    return value, decimals


def _key(d: Decimal) -> Decimal:
    return d.normalize() if d else Decimal(0)


class PaperNumbers:
    """All numeric tokens of one paper's text, extracted once; `has` tests a quoted number's accepted spellings."""

    _TOKEN = re.compile(r"(?<![\d.])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)")
    _SCI = re.compile(r"(?<![A-Za-z\d])([\dl])e\s?[-—–−]\s?(\d+)")
    _POW = re.compile(r"(?:(\d(?:\.\d+)?)\s*(?:\*|\\times|×)\s*)?10\^\{?([-−]?\d+)\}?")

    def __init__(self, text: str, lost_points: bool = False):
        values: set[Decimal] = set()
        self.bare_digits: set[str] = set()
        for m in self._TOKEN.finditer(text):
            tok = m.group(1)
            values.add(_key(Decimal(tok.replace(",", ""))))
            if lost_points and "." not in tok and "," not in tok:
                if len(tok) >= 2 and tok.startswith("0"):
                    values.add(_key(Decimal("0." + tok[1:])))  # "03123" -> 0.3123, "04" -> 0.4
                elif len(tok) >= 4:
                    self.bare_digits.add(tok.strip("0"))  # "5424" -> 54.24 (point position unknown)
        for m in self._SCI.finditer(text):
            values.add(_key(Decimal(f"{1 if m.group(1) == 'l' else m.group(1)}e-{m.group(2)}")))
        for m in self._POW.finditer(text):  # LaTeX: 7*10^{-6}, 10^{-4}
            values.add(_key(Decimal(f"{m.group(1) or 1}e{m.group(2).replace('−', '-')}")))
        self.values = values
        self.sorted = sorted(values)

    def _near(self, c: Decimal, decimals: int) -> bool:
        half = Decimal(5) * Decimal(10) ** (-(decimals + 1))
        i = bisect.bisect_left(self.sorted, c - half)
        return i < len(self.sorted) and self.sorted[i] <= c + half

    def has(self, text: str, exact: bool) -> bool:
        parsed = parse_number(text)
        if parsed is None:
            return False
        q, k = parsed
        spellings = [(q, k)]
        if "e" not in text:  # percent <-> fraction: a fraction (<= 1) as a percentage, a percentage (<= 100) as one
            spellings += [(q * 100, max(k - 2, 0))] if q <= 1 else []
            spellings += [(q / 100, k + 2)] if q <= 100 else []
        for c, kc in spellings:
            if _key(c) in self.values or (not exact and self._near(c, kc)):
                return True
        if self.bare_digits and k > 0:
            digits = str(_key(q)).replace(".", "").strip("0")
            if digits in self.bare_digits:
                return True
        return False


@cache
def paper_numbers(paper: str) -> PaperNumbers:
    text = (PAPERS / PAPER_FILES[paper]).read_text(encoding="utf-8")
    return PaperNumbers(text, lost_points=paper in OCR_LOST_POINTS)


# ---------------------------------------------------------------------------------------------------------------
# grids


@dataclass(frozen=True)
class Finding:
    where: str  # grid file or markdown file, with the key path or line
    number: str
    paper: str  # paper key(s) checked against

    def __str__(self):
        return f"{self.where}: {self.number} does not occur in {self.paper}"


def grid_paper(grid: dict) -> str | None:
    note = str(grid.get("paper_note", ""))
    return next((p for author, p in GRID_AUTHORS.items() if note.startswith(author)), None)


def _leaves(node, path=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, path + (str(k),))
    else:
        yield path, node


def check_grid(name: str, grid: dict) -> list[Finding]:
    """Every number under `paper:` of one grid (its file name `name`) against the paper its paper_note names."""
    if "paper" not in grid:
        return []
    paper = grid_paper(grid)
    if paper is None:
        return [Finding(f"{name}: paper_note names no known paper ({grid.get('paper_note')!r})", "-", "-")]
    nums = paper_numbers(paper)
    out = []
    for path, value in _leaves(grid["paper"]):
        # the YAML text of the value: PyYAML reads 0.4140 as the float 0.414, which is the same number
        text = repr(value) if isinstance(value, float) else str(value)
        if not nums.has(text, exact=True):
            out.append(Finding(f"{name}: paper.{'.'.join(path)}", text, PAPER_FILES[paper]))
    return out


def grid_files() -> list[Path]:
    return sorted((REPO / "configs" / "grid").glob("*.yaml"))


# ---------------------------------------------------------------------------------------------------------------
# prose


def papers_of(path: Path, text: str) -> list[str]:
    head = (path.name + " " + text.split("\n", 1)[0]).lower()
    named = [p for p, words in PAPER_KEYWORDS.items() if any(w in head for w in words)]
    return named or list(PAPER_FILES)


@dataclass(frozen=True)
class Quote:
    line: int
    text: str  # the matched text, whitespace collapsed
    number: str


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def find_quotes(text: str) -> list[Quote]:
    """The paper figures a script can find in a markdown text (module docstring): prose forms and table columns."""
    out = []
    # prose: collapse line breaks inside a paragraph (a quote may be wrapped), keep positions for line numbers
    flat = re.sub(r"\s", " ", text)
    for m in QUOTE.finditer(flat):
        words = m.group(0)[: m.start("nums") - m.start()].lower().split()
        if NOT_A_FIGURE.intersection(w.strip(".") for w in words):
            continue
        for n in NUMBER.finditer(m.group("nums")):
            out.append(Quote(_line_of(text, m.start()), re.sub(r"\s+", " ", m.group(0)).strip(), n.group(0)))
    # tables
    header: list[str] | None = None
    for i, line in enumerate(text.split("\n"), 1):
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
            continue
        if all(set(c) <= set("-: ") for c in cells):
            continue
        paper_row = cells[0].startswith("↳ paper")
        for j, cell in enumerate(cells):
            if j == 0:
                continue
            col = header[j] if j < len(header) else ""
            if paper_row or re.match(r"paper\b", col, re.I):
                for n in NUMBER.finditer(re.sub(r"\([^)]*\)", "", cell) if not paper_row else cell):
                    out.append(Quote(i, cell, n.group(0)))
    return out


def split_errata(text: str) -> tuple[str, str]:
    i = text.find("\n## Erratum")
    return (text, "") if i < 0 else (text[: i + 1], text[i + 1 :])


def _quoted(erratum: str) -> list[str]:
    return [re.sub(r"\s+", " ", q) for q in re.findall(r"\"([^\"]*)\"|“([^”]*)”", erratum) for q in q if q]


def check_markdown(path: Path, text: str | None = None) -> list[Finding]:
    text = path.read_text(encoding="utf-8") if text is None else text
    papers = papers_of(path, text)
    body, errata = split_errata(text)
    retracted = _quoted(errata)
    offset = body.count("\n")
    # erratum text outside double quotes is checked; the double-quoted wrong figures are blanked out (same length)
    errata_checked = re.sub(r"\"[^\"]*\"|“[^”]*”", lambda m: re.sub(r"\S", "x", m.group(0)), errata)
    out = []
    for part, first_line, is_body in ((body, 0, True), (errata_checked, offset, False)):
        for q in find_quotes(part):
            if is_body and any(q.text in r for r in retracted):
                continue
            if not any(paper_numbers(p).has(q.number, exact=False) for p in papers):
                where = f"{path.relative_to(REPO)}:{q.line + first_line} ({q.text!r})"
                out.append(Finding(where, q.number, " or ".join(PAPER_FILES[p] for p in papers)))
    return out


def markdown_files() -> list[Path]:
    return [REPO / "README.md"] + sorted((REPO / "results").glob("*.md")) + sorted((REPO / "docs").glob("*.md"))


# ---------------------------------------------------------------------------------------------------------------
# tests


def test_normaliser_spellings():
    """The accepted spellings, on a made-up text (no paper needed)."""
    nums = PaperNumbers(
        "P@20 0.5904 and 26.1 MRR; .7710 lr 1e—5 or le—2, 1,024 vectors, -9.4% drop; 03123 5424 04"
        " a rate of 71067superscript1067*10^{-6}"
    )
    for ok in (
        "0.5904",
        "59.04",
        ".5904",
        "0.59040",
        "0.261",
        "0.771",
        "1e-5",
        "0.01",
        "1,024",
        "1024",
        "-9.4 %",
        "9.4",
        "0.094",
        "7e-6",
    ):
        assert nums.has(ok, exact=True), ok
    for bad in ("0.5905", "26.2", "1e-4", "0.3123", "54.24", "0.4"):
        assert not nums.has(bad, exact=True), bad
    ocr = PaperNumbers("BM25 03123 5424 0.4140 DGRe-+pair 0.4789 0.19 0.5486 04", lost_points=True)
    for ok in ("0.3123", "54.24", "0.4", "0.414", "0.4140"):
        assert ocr.has(ok, exact=True), ok
    assert not ocr.has("0.3124", exact=True)
    assert nums.has("0.59", exact=False) and nums.has("26", exact=False) and not nums.has("0.59", exact=True)


def test_quote_forms_found():
    text = (
        "the paper's -11.8 %: and the\n  paper's TK loses 17 %. (the paper: 0.6105 to 0.9178 and 0.8372),"
        " paper -0.4; Table 3 prints -9.4 %, -13.4 % and -20.8 %; the papers' conventions, 3 seeds; the paper's"
        " Table 2 and the paper's way -6.6 %.\n\n"
        "| x | ours | paper DPR |\n|---|---|---|\n| a | 0.5 | 0.63 / 0.53 |\n| ↳ paper | 0.3123 | 0.4140 |\n"
    )
    numbers = [q.number.strip() for q in find_quotes(text)]
    assert numbers == [
        "-11.8 %",
        "17 %",
        "0.6105",
        "0.9178",
        "0.8372",
        "-0.4",
        "-9.4 %",
        "-13.4 %",
        "-20.8 %",
        "0.63",
        "0.53",
        "0.3123",
        "0.4140",
    ]


def test_grid_paper_values_occur_in_their_papers():
    require_papers()
    grids_with_paper, findings = 0, []
    for f in grid_files():
        grid = yaml.safe_load(f.read_text(encoding="utf-8"))
        if "paper" in grid:
            grids_with_paper += 1
            findings += check_grid(f.name, grid)
    assert grids_with_paper >= 4
    assert not findings, "grid paper figures not in the paper:\n" + "\n".join(map(str, findings))


def test_prose_paper_quotes_occur_in_their_papers():
    require_papers()
    findings, quotes = [], 0
    for f in markdown_files():
        text = f.read_text(encoding="utf-8")
        quotes += len(find_quotes(text))
        findings += check_markdown(f, text)
    assert quotes >= 50
    assert not findings, "paper figures quoted in records/docs not in the paper:\n" + "\n".join(map(str, findings))


def test_checker_reports_a_perturbed_grid_figure():
    """A real grid with one paper figure moved by +0.0137: reported with the grid file, its key and the number."""
    require_papers()
    f = REPO / "configs" / "grid" / "squad_colbert_heads.yaml"
    grid = yaml.safe_load(f.read_text(encoding="utf-8"))
    assert check_grid(f.name, grid) == []
    original = grid["paper"]["squad"]["colbert"]["ndcg_cut_10"]
    wrong = round(original + 0.0137, 4)
    grid["paper"]["squad"]["colbert"]["ndcg_cut_10"] = wrong
    findings = check_grid(f.name, grid)
    assert len(findings) == 1
    assert str(findings[0]).startswith(f"squad_colbert_heads.yaml: paper.squad.colbert.ndcg_cut_10: {wrong!r} ")
    # the DGRe grid, whose paper is the OCR text: its real values pass, a perturbed one does not
    f = REPO / "configs" / "grid" / "dgre_cranfield_literal.yaml"
    grid = yaml.safe_load(f.read_text(encoding="utf-8"))
    assert check_grid(f.name, grid) == []
    grid["paper"]["cranfield"]["bm25"]["P_20"] = round(grid["paper"]["cranfield"]["bm25"]["P_20"] + 0.0137, 4)
    assert [x.where for x in check_grid(f.name, grid)] == ["dgre_cranfield_literal.yaml: paper.cranfield.bm25.P_20"]


def test_checker_reports_a_perturbed_prose_quote():
    """A real record with one quoted paper figure moved: reported with the file, the line, the quote and the number;
    the same wrong figure repeated verbatim in double quotes by an erratum is no longer reported, while the
    erratum's own figures are checked."""
    require_papers()
    f = REPO / "results" / "2026-11-26-squad-colbert-heads-seed1.md"
    text = f.read_text(encoding="utf-8")
    assert "the paper's 0.6105" in text and check_markdown(f, text) == []
    wrong = text.replace("the paper's 0.6105", "the paper's 0.6242", 1)
    findings = check_markdown(f, wrong)
    assert len(findings) == 1
    line = text[: text.index("the paper's 0.6105")].count("\n") + 1
    assert str(findings[0]) == (
        f'results/2026-11-26-squad-colbert-heads-seed1.md:{line} ("the paper\'s 0.6242"): '
        "0.6242 does not occur in isotropic-representation-dense-retrieval.txt"
    )
    erratum = '\n## Erratum (2026-11-27)\n\n"the paper\'s 0.6242" was wrong: Table 1 prints 0.6105.\n'
    assert check_markdown(f, wrong + erratum) == []
    bad_erratum = '\n## Erratum (2026-11-27)\n\n"the paper\'s 0.6242" was wrong: Table 1 prints 0.6107.\n'
    assert [x.number for x in check_markdown(f, wrong + bad_erratum)] == ["0.6107"]


@pytest.mark.parametrize("ci", ["", "true"])
def test_missing_papers_skip_outside_ci_and_fail_in_ci(monkeypatch, tmp_path, ci):
    """As conftest.require_shared_data does for ../shared/data."""
    monkeypatch.setattr(sys.modules[__name__], "PAPERS", tmp_path / "no-papers")
    monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(expected, match="paper texts"):
        require_papers()
