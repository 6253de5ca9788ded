"""``python -m experiments.doc_tables --show``: any table a JSON holds,
printed as a document shows it, and a wrong request refused by name."""

from __future__ import annotations

import re

import pytest

from experiments import doc_tables


def test_show_prints_the_table_a_document_renders(capsys):
  text = (doc_tables.ROOT / "docs" / "results.md").read_text()
  block = re.search(
    r"<!-- table learning docs/data/learning_lora.json rows=brief -->\n"
    r"(.*?)\n<!-- /table -->",
    text,
    re.S,
  )
  assert block, "results.md renders the LoRA table in brief"
  doc_tables.main(
    ["--show", "learning", "docs/data/learning_lora.json", "rows=brief"]
  )
  assert capsys.readouterr().out.strip() == block[1].strip()
  # Without the option, every row: more than the brief table's.
  doc_tables.main(["--show", "learning", "docs/data/learning_lora.json"])
  full = capsys.readouterr().out
  assert full.count("\n") > block[1].count("\n") + 5


@pytest.mark.parametrize(
  ("args", "message"),
  [
    (["learnin", "docs/data/learning_lora.json"], "renderer 'learnin'"),
    (["learning", "docs/data/nope.json"], "nope.json, which does not exist"),
    (["learning", "docs/data/learning_lora.json", "rows=some"], "rows='some'"),
    (["learning", "docs/data/learning_lora.json", "brief"], "OPTION=VALUE"),
    (["learning"], "KIND FILE"),
  ],
)
def test_show_refuses_what_it_cannot_render_by_name(args, message, capsys):
  with pytest.raises(SystemExit) as e:
    doc_tables.main(["--show", *args])
  assert e.value.code == 2
  assert message in capsys.readouterr().err
