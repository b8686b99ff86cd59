"""Fine-tune a ranker: `python train.py [group=option ...] [key=value ...]` (see configs/ and docs/configuration.md).

Or, by `stage=`, an isotropy head on a fine-tuned ranker (`head`) or its export (`export`): the job table,
pipeline/jobs.py.
"""

if __name__ == "__main__":  # first, before the imports (seconds): a signal during them ends as a later one does
    from core.signals import stop_early

    stop_early()

import sys  # noqa: E402

from pipeline.cli import main  # noqa: E402
from pipeline.run import TRAIN  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], TRAIN))  # its job by the job table (pipeline/jobs.py): finetune, head, export
