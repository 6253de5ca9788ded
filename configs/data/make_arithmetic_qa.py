"""Writes ``arithmetic_qa.jsonl``: one-step word problems in MetaMathQA's
format (``query``, ``response`` ending "The answer is: N"), the dataset
``configs/qa.py`` trains on by default. Deterministic:

  python configs/data/make_arithmetic_qa.py configs/data/arithmetic_qa.jsonl
"""

import json
import random
import sys

NAMES = ("Ann", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana")
ITEMS = ("apples", "books", "coins", "shells", "stamps", "marbles")
GAIN = "{n} has {a} {x}. {n} gets {b} more {x}. How many {x} does {n} have now?"
LOSS = (
  "{n} has {a} {x}. {n} gives away {b} {x}. How many {x} does {n} have left?"
)


def problem(rng: random.Random) -> dict[str, str]:
  n, x = rng.choice(NAMES), rng.choice(ITEMS)
  a, b = rng.randint(1, 20), rng.randint(1, 9)
  if rng.random() < 0.5:
    query, work, c = GAIN, f"{a} + {b} = {a + b}", a + b
  else:
    a += b  # never below zero
    query, work, c = LOSS, f"{a} - {b} = {a - b}", a - b
  return {
    "query": query.format(n=n, x=x, a=a, b=b),
    "response": f"{n} has {work} {x}. The answer is: {c}",
  }


def main(path: str, count: int = 1000) -> None:
  rng = random.Random(0)
  with open(path, "w") as f:
    for _ in range(count):
      f.write(json.dumps(problem(rng)) + "\n")


if __name__ == "__main__":
  main(sys.argv[1])
