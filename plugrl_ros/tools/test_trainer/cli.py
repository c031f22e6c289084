"""``plugrl-test-trainer``: the test trainer from the command line; its exit code says whether the client passed."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from plugrl_ros import stop_request
from plugrl_ros.protocol.messages import REUSE_FEEDBACK_OBS
from plugrl_ros.protocol.server_auth import AccessError
from plugrl_ros.tools.serving import add_access_options
from plugrl_ros.tools.test_trainer.server import TestTrainer
from plugrl_ros.tools.test_trainer.settings import ENDINGS, TrainerSettings


def _parser() -> argparse.ArgumentParser:
    d = TrainerSettings()
    p = argparse.ArgumentParser(
        prog="plugrl-test-trainer",
        description="A PlugRL trainer that checks its one client against the protocol and reports, clause by clause.",
    )
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=d.port, help="0 picks a free port")
    p.add_argument(
        "--script",
        default=",".join(d.script),
        help=f"how each connection ends, comma-separated ({', '.join(ENDINGS)}); the last one ends the run",
    )
    p.add_argument("--feedbacks", type=int, default=d.feedbacks_per_connection, help="feedbacks per connection")
    p.add_argument("--horizon", type=int, default=d.horizon)
    p.add_argument("--action-dim", type=int, default=d.action_dim)
    p.add_argument("--dtype", choices=("f4", "f8"), default="f4", help="action dtype")
    p.add_argument("--features", default="", help=f"comma-separated, e.g. {REUSE_FEEDBACK_OBS}")
    p.add_argument(
        "--no-announce-shape", action="store_true", help="leave action_horizon/action_dim out of the metadata"
    )
    p.add_argument("--no-probe", action="store_true", help="the client does not run the probe environment")
    p.add_argument("--n-envs", type=int, default=None)
    p.add_argument("--metadata-delay", type=float, default=d.metadata_delay_s)
    p.add_argument("--grace", type=float, default=d.grace_s)
    p.add_argument("--reconnect-window", type=float, default=d.reconnect_window_s)
    p.add_argument("--timeout", type=float, default=None, help="give up after this many seconds (exit code 2)")
    add_access_options(p)
    return p


def _split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def _run_cli(settings: TrainerSettings, timeout: float | None) -> int:
    trainer = TestTrainer(settings)
    try:
        port = await trainer.start()
    except AccessError as exc:
        print(f"plugrl-test-trainer: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"plugrl-test-trainer: cannot listen on {settings.host}:{settings.port}: {exc}", file=sys.stderr)
        return 2
    print(f"listening on {settings.scheme}://{_url_host(settings.host)}:{port}", flush=True)
    finished = asyncio.ensure_future(trainer.finished(timeout))
    # Ctrl-C or SIGTERM: what was seen so far is the report (a script cut short proves nothing either way)
    with stop_request.calling_in_loop(asyncio.get_running_loop(), finished.cancel):
        try:
            report = await finished
        except asyncio.TimeoutError:
            print(trainer.report.text(), flush=True)
            return 2
        except asyncio.CancelledError:
            print("interrupted", flush=True)
            print(trainer.report.text(), flush=True)
            return 1 if trainer.report.failed else 0
    print(report.text(), flush=True)
    # a script the client did not let run to its end proves nothing: fail it
    return 1 if report.failed or report.incomplete else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``plugrl-test-trainer``: 0 if no clause failed, 1 if one did (or the script did not finish), 2 on --timeout.

    Stopped by Ctrl-C or SIGTERM, it prints what it saw and exits 0 unless a clause failed.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        settings = TrainerSettings(
            host=args.host,
            port=args.port,
            script=_split(args.script),
            feedbacks_per_connection=args.feedbacks,
            horizon=args.horizon,
            action_dim=args.action_dim,
            action_dtype="<" + args.dtype,
            features=_split(args.features),
            announce_shape=not args.no_announce_shape,
            probe=not args.no_probe,
            n_envs=args.n_envs,
            metadata_delay_s=args.metadata_delay,
            grace_s=args.grace,
            reconnect_window_s=args.reconnect_window,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            api_key_env=args.api_key_env,
        )
    except ValueError as exc:
        parser.error(str(exc))
    stop_request.install()
    logging.basicConfig(level=logging.INFO, format="[plugrl-test-trainer] %(message)s")  # access, refusals
    logging.getLogger("websockets").setLevel(logging.WARNING)
    return asyncio.run(_run_cli(settings, args.timeout))
