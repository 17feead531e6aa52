"""``python -m actors --learner HOST:PORT --num-actors N --envs-per-actor K``."""

import sys

from actors.launcher import main

if __name__ == "__main__":
    sys.exit(main())
