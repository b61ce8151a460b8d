"""`python -m ampflow.cli`: the `ampflow` console script without its installed wrapper."""

from ampflow.cli import main
from ampflow.task_exit import exit_command

exit_command(main())
