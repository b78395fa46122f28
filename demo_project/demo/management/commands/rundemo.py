import signal
import threading

from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.core.management.commands.runserver import Command as Runserver

from everystep.worker import Worker


class Command(BaseCommand):
    help = "Serve the admin with an embedded everystep worker on a thread."

    def add_arguments(self, parser):
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000")

    def handle(self, addrport, **options):
        worker = Worker(pool_size=4, poll=0.5, name="demo-embedded-worker", drain=5,
                        install_signals=False)
        thread = threading.Thread(target=worker.run, name="everystep-worker", daemon=True)

        class Server(Runserver):
            def on_bind(self, server_port):
                super().on_bind(server_port)
                # The worker starts only once the address is bound: when it cannot be
                # (port in use), runserver ends the process with os._exit(1), past the
                # finally below, and a worker started earlier would leave its runs claimed.
                thread.start()

        # SIGTERM (docker stop, systemd, kill) ends the server as Ctrl-C does, so the
        # worker drains below; by default it killed the process, runs mid-step.
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            # No autoreloader: it would start a second process with a second worker.
            call_command(Server(), addrport, use_reloader=False)
        finally:
            worker.stop()
            if thread.is_alive():
                thread.join(10)


def _interrupt(signum, frame):
    raise KeyboardInterrupt

