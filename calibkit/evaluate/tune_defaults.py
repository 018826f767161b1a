"""tune's evidence defaults, in a module with no imports: the CLI's option table reads them at `--help`."""

# tune's evidence by default: a holdout of half the rows and 10,500 traffic texts, so that the plan is confirmed on
# over 5,000 texts the search never saw (a 99 % agreement target needs thousands to certify); the search split
# costs little more than its risky texts (evaluate.risk)
TUNE_HOLDOUT = 0.5
TUNE_TRAFFIC_SIZE = 10_500
# texts of the search split each layer's own damage is ranked on (one evaluation per layer)
TUNE_SENSITIVITY_SAMPLES = 128
