"""`ninfer-chat BUILD_DIR [MESSAGE]`: start the server, send one chat request, print the
reply and the server's timings, stop the server."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ninfer.runtime.server import Server, ServerError


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("build_dir", type=click.Path(path_type=Path, exists=True))
@click.argument("message", default="Hello! Who are you?")
@click.option("--max-tokens", default=48, show_default=True)
@click.option("--temperature", default=0.0, show_default=True)
def main(build_dir: Path, message: str, max_tokens: int, temperature: float) -> None:
    """Chat once with a compiled model."""
    try:
        with Server(build_dir) as srv:
            r = srv.client.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": message}],
                "max_tokens": max_tokens, "temperature": temperature})
    except ServerError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    body = r.json()
    if r.status_code != 200:
        click.echo(f"error {r.status_code}: {body['error']['message']}", err=True)
        sys.exit(1)
    t = body["timings"]
    click.echo(f"user: {message}")
    click.echo(f"assistant: {body['choices'][0]['message']['content']!r}")
    click.echo(f"prompt: {t['prompt_n']} tokens in {t['prompt_ms']:.1f} ms "
               f"({t['prompt_per_second']:.1f} tokens/s); "
               f"reply: {t['predicted_n']} tokens in {t['predicted_ms']:.1f} ms "
               f"({t['predicted_per_second']:.1f} tokens/s); "
               f"finish: {body['choices'][0]['finish_reason']}")


if __name__ == "__main__":
    main()
