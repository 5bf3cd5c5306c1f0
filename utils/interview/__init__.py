"""The interview question bank and its quiz (lesson 08).

The bank is one data file, ``utils/interview/bank.yaml``: a list of entries ::

    - id: trace-vs-script            # unique slug
      lesson: 02_graphs              # the lesson that teaches it
      origin: source                 # "source" (a question of the commissioned material) or "course"
      source_ref: ...                # for origin "source": which question of which document
      question: ...
      strategy: ...                  # how to answer, in a few sentences
      proof:
        code: |                      # small CPU code (seconds) that demonstrates the answer; it asserts the facts
          ...
        metrics: [name, ...]         # and/or: the metrics the lesson records while proving it (see tests)
        needs: [tensorflow]          # optional python modules the code imports

``load_bank()`` reads and validates it (clear errors naming the entry and the field). ``run_proof(entry)`` executes
a code proof in a fresh namespace (``tmpdir`` is a scratch folder, ``SMOKE`` the notebook's mode) and returns a
``ProofResult``. ``card(id)`` shows one question with its strategy and runs its proof; ``quiz(n, seed)`` shows a
seeded random subset with the answers hidden until asked for: ipywidgets buttons where available, an HTML
``<details>`` fallback that also works in the static site, and ``Quiz.reveal(k)`` in a plain terminal.
``practice`` turns the bank into a practice tool: ``practice.pick()`` (a default 30-minute set), ``pick(topic=...)``,
``pick(lesson=...)``; ``practice.prove(id)`` runs one card's proof; ``practice.prove_all()`` runs every proof and
prints one line per card.

    python -m utils.interview validate | list | topics | quiz [--n 5 --seed 0] | practice [--topic T --lesson NN]
                              | prove [ID ...]

Modules: bank (load and validate), proofs (run_proof, recorded), quiz (card, quiz, Quiz), practice (pick, prove,
prove_all, TOPICS), and ``__main__``.
"""

from utils.interview import practice  # the module: practice.pick, practice.prove, practice.prove_all
from utils.interview.bank import BANK_PATH, LESSON_TITLES, BankError, Question, by_lesson, get, load_bank, validate
from utils.interview.proofs import ProofResult, locate, recorded, run_proof, session_results
from utils.interview.quiz import Quiz, card, quiz

__all__ = [
    "BANK_PATH", "LESSON_TITLES", "BankError", "Question", "ProofResult", "load_bank", "validate", "get", "by_lesson",
    "run_proof", "recorded", "locate", "card", "quiz", "Quiz", "session_results", "practice",
]
