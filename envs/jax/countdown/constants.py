"""RAGEN's Countdown text (``config/envs.yaml``, ``ragen/env/countdown``)."""

INSTRUCTIONS = (
  "You are solving the Countdown puzzle. You should use the num list to "
  "create an equation that equals the target. Example answer format: "
  "<think> To find an equation using [3, 5, 2] to get 4. Let's check 2 + 5 "
  "= 7, 7 - 3 = 4. So the answer is 2 + 5 - 3 = 4. </think><answer>2 + 5 - 3"
  "</answer>"
)
TARGET = "Target: "
NUMS = ", nums: ["
SEP = ", "
CLOSE = "]"
# What an answer is made of, for a vocabulary restricted to answers.
ALPHABET = (*"0123456789", "+", "-", "*", "/", "(", ")", " + ", " - ")
