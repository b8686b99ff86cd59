"""Evaluate a checkpoint (or an untrained backbone): `python evaluate.py ckpt=PATH data=cranfield [key=value ...]`.

Or a head checkpoint (`head_ckpt=`), a first-stage model (`model=bm25`), full ranking (`retrieval=dense`) or an
analysis (`analysis=NAME`): the job table, pipeline/jobs.py.
"""

if __name__ == "__main__":  # first, before the imports (seconds): a signal during them ends as a later one does
    from core.signals import stop_early

    stop_early()

import sys  # noqa: E402

from pipeline.cli import main  # noqa: E402
from pipeline.run import EVALUATE  # noqa: E402

if __name__ == "__main__":
    # its job by the job table (pipeline/jobs.py): retrieve, analysis, first_stage, evaluate_head, evaluate
    sys.exit(main(sys.argv[1:], EVALUATE))
