"""The novel shipped for lesson 04: the bytes data/README.md documents, and real English prose."""

import hashlib
import re
from collections import Counter

from helpers.data import DATA_DIR

TEXT = DATA_DIR / "pride_and_prejudice.txt"


def test_shipped_text_matches_its_documented_checksum():
    readme = (DATA_DIR / "README.md").read_text()
    section = readme.split("## `pride_and_prejudice.txt`", 1)[1].split("\n## ", 1)[0]
    documented = re.search(r"sha256 `([0-9a-f]{64})`", section).group(1)
    assert hashlib.sha256(TEXT.read_bytes()).hexdigest() == documented


def test_shipped_text_is_the_novel_within_one_megabyte():
    data = TEXT.read_bytes()
    assert len(data) <= 1_000_000 and data.isascii()
    text = data.decode()
    assert text.startswith("PRIDE AND PREJUDICE") and text.endswith("the means of uniting them.\n")
    assert "It is a truth universally acknowledged" in text
    letters = Counter(c for c in text.lower() if c.isalpha())
    assert [c for c, _ in letters.most_common(3)] == ["e", "t", "a"], "English letter frequencies"
