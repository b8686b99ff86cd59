"""Evaluate a checkpoint (or an untrained backbone): `python evaluate.py ckpt=PATH data=cranfield [key=value ...]`.

Or a head checkpoint (`head_ckpt=`), a first-stage model (`model=bm25`), full ranking (`retrieval=dense`) or an
analysis (`analysis=NAME`): the job table, pipeline/jobs.py.
"""

import sys

from pipeline.cli import main
from pipeline.run import EVALUATE

if __name__ == "__main__":
    # its job by the job table (pipeline/jobs.py): retrieve, analysis, first_stage, evaluate_head, evaluate
    sys.exit(main(sys.argv[1:], EVALUATE))
