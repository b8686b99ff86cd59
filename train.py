"""Fine-tune a ranker: `python train.py [group=option ...] [key=value ...]` (see configs/ and docs/configuration.md).

Or, by `stage=`, an isotropy head on a fine-tuned ranker (`head`) or its export (`export`): the job table,
pipeline/jobs.py.
"""

import sys

from pipeline.cli import main
from pipeline.run import TRAIN

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], TRAIN))  # its job by the job table (pipeline/jobs.py): finetune, head, export
