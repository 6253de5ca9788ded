"""The QA environment's text (RAGEN's ``ragen/env/metamathqa``)."""

INSTRUCTIONS = (
  "You are solving a question. Think it through, then give only the final "
  "answer (a number, a word or a short expression) inside <answer> "
  "</answer>."
)
# RAGEN's observations after an answer.
CORRECT = "Correct!"
INCORRECT = "Incorrect. Please think again."
# The answer follows the last of these in a dataset's answer text: MetaMathQA
# ends its responses with "The answer is: 42", GSM8K with "#### 42". Text
# with neither is the answer itself.
ANSWER_MARKERS = ("The answer is:", "####")
# Field names tried, in order, when a setting names none: MetaMathQA's
# (query, response) and GSM8K's (question, answer).
QUESTION_FIELDS = ("query", "question")
ANSWER_FIELDS = ("response", "answer")
