"""The docs stay true: generated figures match the result files, links and module paths exist, README stays short."""
import re
from pathlib import Path

from benchmarks import table

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAZE = ROOT / "examples" / "maze" / "README.md"
PAGES = ["design", "config", "callbacks", "models", "benchmarks", "fault-tolerance", "metrics", "install", "tools",
         "export", "algorithms", "troubleshooting", "coming-from-trl", "datasets"]
REASONING = ROOT / "examples" / "reasoning" / "README.md"
DOCS = [README, MAZE, REASONING, *(ROOT / "docs" / f"{p}.md" for p in PAGES)]
CODE = ["grpo", "rollout", "sync", "envs", "examples", "benchmarks", "tests"]
# A file or folder of the repository written in backticks, e.g. `grpo/driver/fault.py` or `envs/maze/` (a metric
# key such as `rollout/success_rate` has neither a suffix nor a trailing slash).
REPO_PATH = re.compile(r"`((?:grpo|rollout|sync|envs|examples|benchmarks|tests|requirements|docs)/[\w/-]*(?:\.\w+|/))`")
# A module run with -m; `python -m benchmarks.NAME` (capitals: a placeholder) is left out.
FILE_SUFFIXES = {"py", "json", "jsonl", "md", "yaml", "png"}  # `metrics.jsonl` is a file, not a config field
MODULE = re.compile(r"python -m ((?:grpo|rollout|sync|envs|examples|benchmarks)(?:\.[a-z_]\w*)*)\b(?!\.)")


def _present():
    return [d for d in DOCS if d.is_file()]


def test_every_page_exists():
    missing = [str(d.relative_to(ROOT)) for d in DOCS if not d.is_file()]
    assert not missing, f"missing docs: {missing}"


def test_readme_is_short_and_names_the_two_commands():
    text = README.read_text()
    assert len(text.encode()) <= 12 * 1024, f"README.md is {len(text.encode())} bytes; move detail into docs/"
    assert "make maze" in text and "make test" in text


def test_generated_benchmark_blocks_match_the_result_files():
    docs = [d for d in table.DOCS if d.is_file()]
    assert README in docs and ROOT / "docs" / "benchmarks.md" in docs
    for doc in docs:
        assert "<!-- bench-" in doc.read_text(), f"{doc.name} lost its generated benchmark blocks"
    stale = table.stale(docs)
    assert not stale, f"stale generated figures in {[str(d.relative_to(ROOT)) for d in stale]}: run {table.FIX}"


def test_stale_block_is_found_and_rewritten(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n<!-- bench-headline -->\n| made up | 2.11x |\n<!-- /bench-headline -->\nend\n")
    assert table.stale([doc]) == [doc]
    assert table.main(["--doc", str(doc), "--check"]) == 1
    assert table.main(["--doc", str(doc), "--write"]) == 0
    assert table.stale([doc]) == [] and "2.11x" not in doc.read_text()
    assert doc.read_text().startswith("intro\n<!-- bench-headline -->\n| benchmark |")


def test_links_between_docs_resolve():
    broken = []
    for doc in _present():
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" not in target and not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert not broken, f"links to nothing: {broken}"


def test_paths_and_modules_the_docs_name_exist():
    missing = []
    for doc in _present():
        text = doc.read_text()
        for path in REPO_PATH.findall(text):
            if not (ROOT / path).exists():
                missing.append(f"{doc.relative_to(ROOT)}: {path}")
        for module in MODULE.findall(text):
            base = ROOT.joinpath(*module.split("."))
            if not (base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()):
                missing.append(f"{doc.relative_to(ROOT)}: python -m {module}")
    assert not missing, f"the docs name what the repository does not hold: {missing}"


def test_code_cites_the_design_doc_in_the_repository():
    design = (ROOT / "docs" / "design.md").read_text()
    headings = {h.strip() for h in re.findall(r"^#+ (.+)$", design, re.M)}
    outside = "DESIGN" + ".md"  # the notes the project started from, not in this repository
    bad = []
    for folder in CODE:
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            if outside in text:
                bad.append(f"{path.relative_to(ROOT)} cites {outside}: cite docs/design.md and its section")
            for section in re.findall(r"docs/design\.md(?:'s|,) \"([^\"]+)\"", text):
                if section not in headings:
                    bad.append(f"{path.relative_to(ROOT)} cites a section docs/design.md lacks: {section!r}")
    assert not bad, "\n".join(bad)


def test_config_fields_the_docs_name_exist():
    import dataclasses

    from grpo.config import RunConfig

    # Each section's fields, from the class its default factory builds (RunConfig itself needs a model).
    sections = {f.name: {g.name for g in dataclasses.fields(f.default_factory)} for f in dataclasses.fields(RunConfig)
                if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory)}
    assert {"algorithm", "rollout", "fault", "metrics"} <= sections.keys()
    wrong = []
    for doc in _present():
        # `section.field` in backticks or as a --section.field override
        for section, name in re.findall(r"(?:`|--)([a-z_]+)\.([a-z_]+)\b", doc.read_text()):
            if section in sections and name not in sections[section] and name not in FILE_SUFFIXES:
                wrong.append(f"{doc.relative_to(ROOT)}: {section}.{name}")
    assert not wrong, f"the docs name config fields RunConfig does not have: {wrong}"
