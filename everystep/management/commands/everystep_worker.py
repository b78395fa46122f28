import contextlib
import logging

from django.core.management.base import BaseCommand, CommandError

from everystep.errors import EverystepError, WorkflowImportError
from everystep.worker import Worker, exit_now_if_abandoned


class Command(BaseCommand):
    help = (
        "Claim scheduled runs and execute them. SIGTERM/SIGINT drains: runs leave at their "
        "next step boundary and are requeued; a second signal stops waiting."
    )

    def add_arguments(self, parser):
        parser.add_argument("--pool", type=int, default=4, help="runs executed at once (default 4)")
        parser.add_argument(
            "--poll", type=float, default=0.2, help="seconds between claims when idle (default 0.2)"
        )
        parser.add_argument(
            "--name",
            default=None,
            help="unique among live workers and stable across restarts (default: the hostname)",
        )
        parser.add_argument(
            "--drain",
            type=float,
            default=30,
            help="seconds to wait at shutdown before requeueing runs mid-step; 0 waits forever (default 30)",
        )
        parser.add_argument("--metrics-port", type=int, default=None, help="serve this worker's metrics")
        parser.add_argument("--metrics-bind", default="0.0.0.0", help="address for --metrics-port")
        parser.add_argument(
            "--no-listen", action="store_true", help="PostgreSQL: poll only, no LISTEN/NOTIFY pickup"
        )

    def handle(self, *, pool, poll, name, drain, metrics_port, metrics_bind, no_listen, verbosity, **options):
        if name is not None and not name.strip():
            raise CommandError("--name must not be empty")
        if metrics_port is not None and not 0 < metrics_port < 65536:
            raise CommandError(f"--metrics-port must be a TCP port (1-65535), got {metrics_port}")
        try:
            worker = Worker(
                pool_size=pool,
                poll=poll,
                name=name,
                drain=drain,
                metrics_port=metrics_port,
                metrics_bind=metrics_bind,
                listen=not no_listen,
            )
        except EverystepError as exc:
            raise CommandError(str(exc))
        try:
            with self.printing_log(verbosity):
                worker.run()
        except WorkflowImportError as exc:
            for failure in exc.failures:
                self.stderr.write(failure.traceback)
            raise CommandError(str(exc))
        except EverystepError as exc:  # at start-up, e.g. the metrics port is taken
            raise CommandError(str(exc))
        exit_now_if_abandoned(worker)

    @contextlib.contextmanager
    def printing_log(self, verbosity: int):
        """Print the ``everystep`` logger's lines (start-up, each run's end; the
        claims too at verbosity 2), as runserver prints requests, unless the
        project's LOGGING already sends them somewhere (then it decides), or
        ``--verbosity 0``."""
        logger = logging.getLogger("everystep")
        if verbosity == 0 or logger.hasHandlers():
            yield
            return
        level = logging.DEBUG if verbosity >= 2 else logging.INFO
        handler = CommandOutput(self, level)
        previous = logger.level
        logger.addHandler(handler)
        logger.setLevel(level)
        try:
            yield
        finally:
            logger.removeHandler(handler)
            logger.setLevel(previous)


class CommandOutput(logging.Handler):
    """Log records on a command's stdout, warnings and errors on its stderr."""

    def __init__(self, command: BaseCommand, level: int):
        super().__init__(level)
        self.command = command
        self.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", "%Y-%m-%d %H:%M:%S"))

    def emit(self, record):
        try:
            stream = self.command.stderr if record.levelno >= logging.WARNING else self.command.stdout
            stream.write(self.format(record))
            stream.flush()
        except Exception:
            self.handleError(record)
