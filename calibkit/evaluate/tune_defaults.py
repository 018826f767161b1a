"""tune's evidence defaults, in a module with no imports: the CLI's option table reads them at `--help`."""

# tune's evidence by default: a holdout of half the rows and 10,500 traffic texts, so that the plan is confirmed on
# over 5,000 texts the search never saw (a 99 % agreement target needs thousands to certify); the search split
# costs little more than its risky texts (evidence.risk)
TUNE_HOLDOUT = 0.5
TUNE_TRAFFIC_SIZE = 10_500
# texts of the search split each layer's own damage is ranked on (one evaluation per layer); method auto chooses
# each tensor's method on the same texts, so the ranking reuses its runs (evaluate.tune)
TUNE_SENSITIVITY_SAMPLES = 64
# the search's prune stage: layers under half a percent of the linear FLOPs are returned to INT8 together (one
# evaluation, not one each), and the stage measures at most 8 candidates (measured on the demo classifier: the
# unbounded stage spent 30 of 39 evaluations to move the plan from 77 % to 83 % INT8, most of it on layers of 0.1 %)
TUNE_PRUNE_MIN_SHARE = 0.005
TUNE_PRUNE_BUDGET = 8
# method auto: each tensor takes, among the race's best methods (this many), the one whose range does the least
# damage where it is read, measured node by node on this many texts of the sensitivity subset (the ranking
# reuses those runs where the subsets coincide: evaluate.tune)
TUNE_AUTO_FINALISTS = 2
TUNE_AUTO_TEXTS = 64
# all-INT8 on the holdout is context for the plan's numbers (what the plan buys), not a decision: once a plan is
# confirmed it is measured on this many random holdout texts (about 1 point of interval at 97 %), not on every
# one (measured on the demo classifier: 48 s of a 663-s run for 5,779 texts). On the whole holdout where it is
# less than twice as large (the sample would save little), and where the holdout confirmed nothing: all-INT8 may
# then be written instead
TUNE_ALL_INT8_HOLDOUT_TEXTS = 1_000


def all_int8_holdout_texts(holdout: int) -> int:
    """How many of ``holdout`` texts all-INT8 is measured on once a plan is confirmed."""
    return holdout if holdout <= 2 * TUNE_ALL_INT8_HOLDOUT_TEXTS else TUNE_ALL_INT8_HOLDOUT_TEXTS

# the most candidates the holdout confirms (evidence.confirm): the least INT8 one and the three with the most; each
# is a pass over the holdout (six made the confirmation 323 s of a 922-s demo tune on two cores)
TUNE_CONFIRM_CANDIDATES = 4
