"""A Python language host for the Pulumi engine: runs directory programs such as ``stacks/local``.

The engine runs ``pulumi-language-python`` (found next to the ``pulumi`` binary or on PATH)
for projects with ``runtime: python``. Pulumi's own host is a Go module the module proxy here
refuses, so ``tools/pulumi/pulumi-language-python`` starts this module instead::

    pulumi-language-python [--tracing URL] [--logtostderr] [-v=N] ENGINE_ADDRESS

It serves the ``LanguageRuntime`` gRPC service on a loopback port, to this user's processes
only (``Run`` executes the program a request names), and prints that port as its first line of
stdout, which is how the engine finds it. The server is the Pulumi SDK's own
``LanguageServer`` (the one the Automation API serves inline programs with); ``Run`` configures
the SDK runtime from the request exactly as ``pulumi-language-python-exec`` does and runs the
project's ``__main__.py`` in this process, with this interpreter (``$PULUMI_PYTHON_CMD``).

Implemented RPCs: Handshake, GetPluginInfo, GetRequiredPlugins, GetRequiredPackages, Run,
About, GetProgramDependencies, InstallDependencies, RuntimeOptionsPrompts, Cancel. Code
generation (Generate*, Pack, Link, Template) and RunPlugin answer UNIMPLEMENTED.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import importlib.metadata
import logging
import os
import runpy
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pulumi
from google.protobuf import empty_pb2
from pulumi.automation._server import LanguageServer, _suppress_unobserved_task_logging
from pulumi.runtime import reset_options, run_in_stack, set_all_config
from pulumi.runtime._grpc_settings import _GRPC_CHANNEL_OPTIONS
from pulumi.runtime.proto import language_pb2, language_pb2_grpc, plugin_pb2

from skyward_iac.api.errors import SkywardError
from skyward_iac.same_user import guarded_server

#: How often the host checks that the engine that started it is still there.
PARENT_POLL_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class Program:
    """Where a ``RunRequest``'s program lives: its entry point and the directories around it."""

    path: Path  # the entry point: a directory holding __main__.py, or a .py file
    pwd: Path
    root: Path  # where Pulumi.yaml is

    @classmethod
    def from_request(cls, request: Any) -> Program:
        """Read the program location from ``request.info``, falling back to the older fields."""
        info = request.info
        program_dir = info.program_directory or request.pwd or os.getcwd()
        entry = info.entry_point or request.program or "."
        pwd = request.pwd or program_dir
        return cls(path=(Path(program_dir) / entry).resolve(), pwd=Path(pwd),
                   root=Path(info.root_directory or program_dir))


def _user_traceback(program: Path) -> str:
    """The current exception's traceback from the first frame of the user's program on."""
    frames = traceback.extract_tb(sys.exc_info()[2])
    inside = program if program.is_dir() else program.parent
    for index, frame in enumerate(frames):
        # "<frozen runpy>" is not a path, though it resolves to one under the program's cwd.
        if frame.filename.startswith("/") and Path(frame.filename).is_relative_to(inside):
            return traceback.format_exc(limit=-(len(frames) - index))
    return traceback.format_exc()


class LanguageHost(LanguageServer):
    """The SDK's ``LanguageServer`` serving a directory program instead of an inline function."""

    def __init__(self, engine_address: str) -> None:
        super().__init__(program=lambda: None)
        self.engine_address = engine_address
        # Run changes process-wide state (cwd, sys.argv): one program at a time.
        self._run_lock = threading.Lock()

    def Handshake(self, request: Any, context: Any) -> Any:
        # Only sent when the engine attaches to an already running host (PULUMI_DEBUG_LANGUAGES).
        if request.engine_address:
            self.engine_address = request.engine_address
        return language_pb2.LanguageHandshakeResponse()

    def GetPluginInfo(self, request: Any, context: Any) -> Any:
        return plugin_pb2.PluginInfo(version=importlib.metadata.version("pulumi"))

    def GetRequiredPackages(self, request: Any, context: Any) -> Any:
        # Pulumi's host lists every provider SDK installed in the environment, so stacks/local
        # would demand the aws and gcp plugins. None are listed here: the engine loads a
        # provider when the program first registers one, and only then needs its plugin.
        return language_pb2.GetRequiredPackagesResponse()

    def GetProgramDependencies(self, request: Any, context: Any) -> Any:
        found = {(d.metadata["Name"] or "", d.version) for d in importlib.metadata.distributions()}
        return language_pb2.GetProgramDependenciesResponse(dependencies=[
            language_pb2.DependencyInfo(name=name, version=version)
            for name, version in sorted(found) if name
        ])

    def InstallDependencies(self, request: Any, context: Any) -> Iterator[Any]:
        # The program runs in the interpreter that runs this host; there is no venv to build.
        yield language_pb2.InstallDependenciesResponse(stdout=(
            f"nothing to install: programs run with {sys.executable} "
            "(set PULUMI_PYTHON_CMD to choose another interpreter)\n").encode())

    def RuntimeOptionsPrompts(self, request: Any, context: Any) -> Any:
        return language_pb2.RuntimeOptionsResponse()

    def Cancel(self, request: Any, context: Any) -> Any:
        return empty_pb2.Empty()

    def Run(self, request: Any, context: Any) -> Any:
        program = Program.from_request(request)
        _suppress_unobserved_task_logging()  # type: ignore[no-untyped-call]
        with self._run_lock, _process_state(program, list(request.args)):
            return contextvars.copy_context().run(self._run, request, program)

    def _run(self, request: Any, program: Program) -> Any:
        reset_options(
            project=request.project, stack=request.stack, root_directory=str(program.root),
            parallel=request.parallel, engine_address=self.engine_address,
            monitor_address=request.monitor_address, preview=request.dryRun,
            organization=request.organization or "organization",
        )
        set_all_config(dict(request.config), list(request.configSecretKeys))
        loop = asyncio.new_event_loop()
        # As pulumi-language-python-exec: resource registrations run on the default executor.
        executor = futures.ThreadPoolExecutor(max_workers=max(request.parallel, 1) * 4)
        loop.set_default_executor(executor)
        loop.set_exception_handler(self._exception_handler)

        def run_program() -> None:
            main = program.path / "__main__.py" if program.path.is_dir() else program.path
            if not main.is_file():
                raise _ProgramMissing(program.path)
            runpy.run_path(str(program.path), run_name="__main__")

        try:
            loop.run_until_complete(run_in_stack(run_program))
        except grpc.RpcError as exc:
            # The engine is shutting down (for example after a cancel): nothing to report.
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                return language_pb2.RunResponse()
            return language_pb2.RunResponse(error=f"RPC error: {exc.details()}")
        except pulumi.RunError as exc:
            return _bail(str(exc))
        except SystemExit as exc:
            # sys.exit() in a program ends the program, not this host.
            if exc.code in (0, None):
                return language_pb2.RunResponse()
            return _bail(f"the program exited with {exc.code!r}")
        except (_ProgramMissing, SkywardError) as exc:
            # These messages already say what to do; a traceback would only bury them.
            return _bail(f"{type(exc).__name__}: {exc}")
        except Exception:  # noqa: BLE001 - reported to the user, as the stock host does
            return _bail("Program failed with an unhandled exception:\n"
                         + _user_traceback(program.path))
        finally:
            _close_loop(loop)
            executor.shutdown(wait=True)
            sys.stdout.flush()
            sys.stderr.flush()
        return language_pb2.RunResponse()


class _ProgramMissing(Exception):
    def __init__(self, path: Path) -> None:
        super().__init__(f"no Python program at {path}: a stack directory needs a __main__.py "
                         "(or Pulumi.yaml `main:` naming the program file)")


def _bail(message: str) -> Any:
    """Show ``message`` as an error of the update and tell the engine it has been reported."""
    pulumi.log.error(message)
    return language_pb2.RunResponse(bail=True)


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    # A failed program can leave tasks pending; cancel them so closing the loop stays quiet.
    for task in asyncio.all_tasks(loop):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            loop.run_until_complete(task)
    loop.close()


@contextlib.contextmanager
def _process_state(program: Program, args: list[str]) -> Iterator[None]:
    """Run in the program's directory with its argv, as ``python __main__.py`` would."""
    cwd, argv, path = os.getcwd(), sys.argv, list(sys.path)
    os.chdir(program.pwd)
    sys.argv = [str(program.path), *args]
    # runpy adds a directory entry point to sys.path itself; a file entry point needs its folder.
    if program.path.is_file():
        sys.path.insert(0, str(program.path.parent))
    try:
        yield
    finally:
        os.chdir(cwd)
        sys.argv, sys.path[:] = argv, path


def _exit_with_parent(parent: int) -> None:
    # The engine kills its plugins when it is done, but if it dies first nobody would.
    while os.getppid() == parent:
        threading.Event().wait(PARENT_POLL_SECONDS)
    os._exit(0)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The engine's plugin arguments: logging and tracing flags, then the engine address."""
    parser = argparse.ArgumentParser(prog="pulumi-language-python")
    parser.add_argument("--tracing", help="tracing endpoint (accepted, not used)")
    parser.add_argument("--logtostderr", action="store_true", help="log to stderr")
    parser.add_argument("-v", dest="verbose", type=int, default=0, help="log verbosity")
    parser.add_argument("engine_address", nargs="?", default="",
                        help="the engine's gRPC address (also sent by Handshake)")
    # Flags of Pulumi's own host (-root, -virtualenv, ...) are accepted and ignored.
    args, _unknown = parser.parse_known_args(list(argv))
    return args


def serve(engine_address: str, host: str = "127.0.0.1") -> tuple[grpc.Server, int]:
    """Start the LanguageRuntime server on a free loopback port; returns it and the port.
    ``Run`` executes the program a request names, so only this user's processes are served
    (``same_user.py``)."""
    server = guarded_server(futures.ThreadPoolExecutor(max_workers=4),
                            options=_GRPC_CHANNEL_OPTIONS)
    language_pb2_grpc.add_LanguageRuntimeServicer_to_server(LanguageHost(engine_address), server)
    port = server.add_insecure_port(f"{host}:0")
    server.start()
    return server, port


def main(argv: Sequence[str] | None = None) -> None:
    """Serve until the engine kills this process; the port is the first line on stdout."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.logtostderr or args.verbose:
        logging.basicConfig(stream=sys.stderr, level=logging.DEBUG if args.verbose >= 9
                            else logging.INFO)
    server, port = serve(args.engine_address)
    sys.stdout.write(f"{port}\n")
    sys.stdout.flush()
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        server.stop(0)


if __name__ == "__main__":
    sys.exit(main())
