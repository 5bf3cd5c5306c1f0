"""Small data sets shipped with the course (lesson 05).

``sentences.csv``: 240 short English sentences written for this course, 60 in each of four topics (weather, food,
sports, technology), interleaved so that every prefix is balanced. Lesson 05 trains its Triton ensemble's classifier
on them.
"""

from __future__ import annotations

import csv
from pathlib import Path

__all__ = ["DATA_DIR", "labeled_sentences"]

DATA_DIR = Path(__file__).resolve().parent


def labeled_sentences(split: str = "all") -> tuple[list[str], list[str], list[str]]:
    """(texts, labels, classes) from sentences.csv (lesson 05).

    split: "all", "train" (three quarters) or "test" (the other quarter, every fourth group of four rows, so each
    split holds every class equally). classes is the sorted list of label names.
    """
    if split not in {"all", "train", "test"}:
        raise ValueError(f"split must be 'all', 'train' or 'test', got {split!r}")
    path = DATA_DIR / "sentences.csv"
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    if not rows or set(rows[0]) != {"text", "label"}:
        raise ValueError(f"{path} must have the columns text,label")
    texts, labels = [], []
    for i, row in enumerate(rows):
        is_test = (i // 4) % 4 == 3
        if split == "all" or (split == "test") == is_test:
            texts.append(row["text"])
            labels.append(row["label"])
    return texts, labels, sorted({row["label"] for row in rows})
