"""The bandit's arm names and prompt text, in one place.

Each pair is (low-risk name, high-risk name). Training draws from
``TRAIN_PAIRS`` and evaluation from the disjoint ``TEST_PAIRS`` (RAGEN's
lists), so a policy that learns the names' meaning, not the names, carries
over.
"""

TRAIN_PAIRS = (
  ("Teacher", "Trader"),
  ("Nurse", "StartupFounder"),
  ("Librarian", "Investor"),
  ("Accountant", "StockBroker"),
  ("Engineer", "RealEstateAgent"),
  ("Pharmacist", "Musician"),
  ("Clerk", "Freelancer"),
  ("Technician", "Youtuber"),
  ("Planner", "Artist"),
  ("Postman", "Pilot"),
  ("Banker", "VentureCapitalist"),
  ("Gardener", "Cryptominer"),
)
TEST_PAIRS = (
  ("Receptionist", "Explorer"),
  ("Archivist", "Filmmaker"),
  ("Bookkeeper", "Consultant"),
  ("SocialWorker", "Photographer"),
  ("Mechanic", "GameDesigner"),
  ("Secretary", "Entrepreneur"),
  ("Cashier", "DataScientist"),
  ("CivilServant", "StartupAccelerator"),
)
SPLITS = {"train": TRAIN_PAIRS, "test": TEST_PAIRS}

# Action id -> name: every arm name of both splits, so one action table
# serves both; only the two arms of the current episode are available.
ACTIONS = tuple(name for pairs in SPLITS.values() for p in pairs for name in p)

# RAGEN's bandit prompt, split around the arm names (a, b in shown order):
# INTRO a AND b RULES a AND b FORMAT a OR b END.
INTRO = (
  "You are playing a bandit game. Goal: Maximize your total reward by "
  "choosing which arm to pull.\nGame Rules:\n1. There are 2 arms, named "
)
AND = " and "
RULES = (
  "\n2. Each arm has its own reward distribution, related to their names."
  "\n3. Analyze the symbolic meaning of each arm's name to guess how their "
  "reward distribution might behave.\n4. Based on the symbolic meaning of "
  "their names, which arm do you think is more likely to give higher "
  "rewards on average? Choose between "
)
FORMAT = ", and output like <answer> "
OR = " </answer> or <answer> "
END = " </answer>.\n"
# After the pull: "<arm>: <reward> points".
COLON = ": "
POINTS = " points"
