"""python -m utils.interview validate | list | topics | quiz [--n 5 --seed 0] | practice [--topic T --lesson NN]
| prove [ID ...] (lesson 08)."""

from __future__ import annotations

import sys

from utils.interview import practice
from utils.interview.bank import BANK_PATH, by_lesson, get, load_bank
from utils.interview.proofs import run_proof
from utils.interview.quiz import _wrap, quiz


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m utils.interview", description="The lesson 08 question bank.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("validate", help="check the bank file")
    sub.add_parser("list", help="list the questions by lesson")
    qp = sub.add_parser("quiz", help="a seeded random quiz; press Enter to reveal each answer")
    qp.add_argument("--n", type=int, default=5)
    qp.add_argument("--seed", type=int, default=0)
    qp.add_argument("--lesson", action="append", default=None, help="e.g. 02 (repeatable)")
    sub.add_parser("topics", help="list the practice topics")
    tp = sub.add_parser("practice", help="a practice set (default: about 30 minutes); Enter reveals each answer")
    tp.add_argument("--topic", default=None, help="e.g. quantization (see `topics`)")
    tp.add_argument("--lesson", action="append", default=None, help="e.g. 02 (repeatable)")
    tp.add_argument("--minutes", type=int, default=practice.DEFAULT_MINUTES)
    tp.add_argument("--seed", type=int, default=0)
    pp = sub.add_parser("prove", help="run code proofs (all, or the ids given)")
    pp.add_argument("ids", nargs="*")
    args = parser.parse_args(argv)

    bank = load_bank()
    if args.cmd == "validate":
        print(f"{BANK_PATH.name}: {len(bank)} questions, {len(by_lesson(bank))} lessons, "
              f"{sum(bool(q.code) for q in bank)} code proofs, {sum(bool(q.metrics) for q in bank)} lesson pointers")
        return 0
    if args.cmd == "list":
        for stem, qs in by_lesson(bank).items():
            print(f"{stem}:")
            for q in qs:
                print(f"  {q.id:34s} {q.question[:80]}")
        return 0
    if args.cmd == "topics":
        practice.topics(bank)
        return 0
    if args.cmd in ("quiz", "practice"):
        if args.cmd == "quiz":
            qz = quiz(args.n, args.seed, args.lesson, show=False, bank=bank)
        else:
            qz = practice.pick(args.topic, args.lesson, minutes=args.minutes, seed=args.seed, show=False, bank=bank)
            print(f"{qz.title}: run `python -m utils.interview prove ID` for a card's proof")
        interactive = sys.stdin.isatty()
        for k, q in enumerate(qz.questions):
            print(f"\n{k}. {q.question}")
            if interactive:
                input("   (Enter to reveal) ")
            print("   " + "\n   ".join(_wrap(q.strategy, 100)))
            if args.cmd == "practice":
                print(f"   proof: python -m utils.interview prove {q.id}")
        return 0
    ids = args.ids or [q.id for q in bank if q.code]
    failed = 0
    for qid in ids:
        res = run_proof(get(qid, bank))
        print(res)
        if not res.ok:
            failed += 1
            print(res.output + res.error)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
