#!/usr/bin/env python3
"""serve.py - an OpenAI-compatible server on top of devio-server.

    python3 examples/openai/serve.py --devio http://127.0.0.1:8080 --listen 127.0.0.1:8000 \\
        --model .devio/models/SmolLM2-135M-Instruct.Q4_1.gguf

devio takes and gives token ids; this server owns the text and the schedule. It tokenizes
with the model's own vocabulary (the GGUF file devio serves, or a Hugging Face directory's
tokenizer.json), renders the chat template GET /v1/model gives, and batches every running
request into each devio step (engine.py). Routes: GET /v1/models, POST /v1/completions,
POST /v1/chat/completions (whole or streamed), GET /health. It prints `listening PORT` on
standard output once it serves (PORT is the one bound, useful with port 0).
See examples/openai/README.md."""
import argparse
import logging
import os
import pathlib
import socket
import sys

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_MODEL = HERE.parents[1] / ".devio" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0].split(" - ", 1)[1])
    ap.add_argument("--devio", action="append", default=[], metavar="URL",
                    help="devio-server to drive: http://HOST:PORT, https://HOST:PORT or "
                    "unix:///PATH; more than once, requests are placed on them by prefix and "
                    "load [http://127.0.0.1:8080]")
    ap.add_argument("--prefill", action="append", default=[], metavar="URL",
                    help="with --decode: a devio-server that prefills prompts and samples their "
                    "first token; each request's state then moves to a --decode server")
    ap.add_argument("--decode", action="append", default=[], metavar="URL",
                    help="with --prefill: a devio-server that decodes the requests moved to it")
    ap.add_argument("--prefix-slack", type=int, default=4, metavar="N",
                    help="with several servers: a request goes where the longest run of its "
                    "prompt's leading KV blocks is stored unless that server has more than N "
                    "requests over the least loaded one [4]")
    ap.add_argument("--devio-token-file", metavar="FILE",
                    help="file holding devio-server's bearer token, when it has one")
    ap.add_argument("--listen", default="127.0.0.1:8000", metavar="HOST:PORT",
                    help="address to serve on; port 0 picks a free one [127.0.0.1:8000]")
    ap.add_argument("--model", default=str(DEFAULT_MODEL), metavar="PATH",
                    help="the model devio-server serves, for its vocabulary: the GGUF file, or a "
                    "Hugging Face directory with tokenizer.json [.devio/models/"
                    "SmolLM2-135M-Instruct.Q4_1.gguf, where deploy/fetch-model.sh puts it]")
    ap.add_argument("--served-model-name", metavar="NAME",
                    help="the model name of /v1/models and answers [the --model file's name, "
                    "without .gguf]")
    ap.add_argument("--chat-template", metavar="FILE",
                    help="a jinja2 chat template to use instead of GET /v1/model's")
    ap.add_argument("--step-tokens", type=int, default=512, metavar="N",
                    help="tokens per devio step, decode rows and prompt chunks together; at most "
                    "devio's max_batch_tokens [512]")
    ap.add_argument("--max-running", type=int, default=0, metavar="N",
                    help="requests in the batch at once, at most --step-tokens; 0 = devio's max_rows "
                    "(or --step-tokens, when fewer) [0]")
    ap.add_argument("--default-max-tokens", type=int, default=256, metavar="N",
                    help="max_tokens of a request that gives none, less where the context ends [256]")
    ap.add_argument("--devio-retry-s", type=float, default=30.0, metavar="SECONDS",
                    help="how long a step (or a new sequence) devio refuses for a transient reason "
                    "(409 depth_exceeded when another client holds its tickets, out_of_kv_blocks, "
                    "out_of_logits, key_in_use, 503 store_unavailable, ...) is tried again before "
                    "its requests are answered 503 [30]")
    ap.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                    help="least level logged on standard error; debug adds an access line per "
                    "request [info]")
    a = ap.parse_args(argv)
    if bool(a.prefill) != bool(a.decode) or (a.prefill and a.devio):
        ap.error("--prefill and --decode go together, and without --devio")
    if not a.devio and not a.prefill:
        a.devio = ["http://127.0.0.1:8080"]
    if a.step_tokens < 1 or a.max_running < 0 or a.default_max_tokens < 1 or \
            not 0 <= a.devio_retry_s <= 3600:
        ap.error("--step-tokens and --default-max-tokens must be positive, --max-running >= 0, "
                 "--devio-retry-s from 0 to 3600")
    return a


def bind(listen):
    """A listening socket for HOST:PORT or [IPV6]:PORT."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError("--listen takes HOST:PORT, not %r" % listen)
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def main(argv):
    a = parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.path.insert(0, str(HERE))
    import contextlib

    import uvicorn

    from api import Api
    from engine import Engine
    from router import Router
    from text import Vocabulary

    token = None
    if a.devio_token_file:
        with open(a.devio_token_file, encoding="utf-8") as f:
            token = f.read().strip()
    kw = dict(step_tokens=a.step_tokens, max_running=a.max_running, retry_s=a.devio_retry_s)
    if len(a.devio) == 1:   # one server: one engine, no router
        try:
            engine = Engine(a.devio[0], token=token, **kw)
        except Exception as e:  # ConnectionLost, DevioError, or a limit that does not fit
            raise ValueError("cannot drive devio-server at %s: %s" % (a.devio[0], e)) from None
    else:
        engine = Router(a.devio, a.prefill, a.decode, token=token, prefix_slack=a.prefix_slack,
                        **kw)
    servers = ", ".join(a.devio) or "prefill %s, decode %s" % (" ".join(a.prefill),
                                                             " ".join(a.decode))
    template = engine.model["chat_template"]
    if a.chat_template:
        with open(a.chat_template, encoding="utf-8") as f:
            template = f.read()
    vocab = Vocabulary(a.model, template, engine.model["bos_token_id"], engine.model["eos_token_id"])
    if vocab.size > engine.vocab_size:
        raise ValueError("%s has %d tokens; the model devio serves has %d: not the same model"
                         % (a.model, vocab.size, engine.vocab_size))
    name = a.served_model_name or os.path.basename(a.model.rstrip("/")).removesuffix(".gguf")
    sock = bind(a.listen)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        engine.start()
        logging.getLogger("devio.openai").info(
            "serving %s from %s: up to %d requests a step, %d tokens a step",
            name, servers, engine.max_running, engine.step_tokens)
        print("listening %d" % sock.getsockname()[1], flush=True)
        yield
        engine.stop()

    app = Api(engine, vocab, name, a.default_max_tokens).app(lifespan)
    config = uvicorn.Config(app, log_level=a.log_level, timeout_graceful_shutdown=5,
                            access_log=a.log_level == "debug")
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (OSError, ValueError) as e:
        print("serve.py: %s" % e, file=sys.stderr)
        sys.exit(1)
