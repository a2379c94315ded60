"""text.py - the text side that devio leaves to its client: the model's vocabulary as a `tokenizers`
tokenizer, its chat template rendered with jinja2 (sandboxed), and each request's output text
grown a token at a time, with stop strings cut off and a tail held back until it is safe to send."""
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "gguf"))

REPLACEMENT = "\ufffd"  # what a decode gives for a UTF-8 sequence a later token completes


def _byte_level_alphabet():
    """The character that stands for each byte in a byte-level BPE vocabulary, inverted: the
    printable Latin-1 bytes stand for themselves, the others for 256, 257, ... in byte order."""
    printable = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, spare = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + spare)] = b
            spare += 1
    return table


class Vocabulary:
    """The served model's tokenizer and chat template.

    `model` is the GGUF file devio serves (its byte-level BPE vocabulary, through
    tools/gguf/vocab.py) or a Hugging Face directory with tokenizer.json. `chat_template`
    is the template text (GET /v1/model's, or a file's), or None."""

    def __init__(self, model, chat_template, bos_id, eos_id):
        self.bos_id, self.eos_id = bos_id, eos_id
        if os.path.isdir(model):
            from tokenizers import Tokenizer
            self.tk = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
            cfg = _json_or_empty(os.path.join(model, "tokenizer_config.json"))
            self.add_bos = bool(cfg.get("add_bos_token"))
            decoder = _json_or_empty(os.path.join(model, "tokenizer.json")).get("decoder") or {}
            self.byte_level = decoder.get("type") == "ByteLevel"
        else:
            import gguf_file
            from vocab import build_tokenizer
            meta = gguf_file.read(model).metadata
            self.tk = build_tokenizer(meta)
            self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token"))
            self.byte_level = True
        self.size = self.tk.get_vocab_size(with_added_tokens=True)
        self.special = {i for i, t in self.tk.get_added_tokens_decoder().items() if t.special}
        self.bytes_of_char = _byte_level_alphabet()
        self.template = _compile(chat_template) if chat_template else None

    def encode(self, text):
        """Token ids of a text; the BOS token first when the model's tokenizer adds one."""
        ids = self.tk.encode(text, add_special_tokens=False).ids
        if self.add_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids):
        return self.tk.decode(ids, skip_special_tokens=True)

    def render_chat(self, messages):
        """The chat template applied to the messages, with the generation prompt."""
        if self.template is None:
            raise ValueError("the model has no chat template (start the server with --chat-template)")
        return self.template.render(messages=messages, add_generation_prompt=True,
                                    bos_token=self._token_text(self.bos_id),
                                    eos_token=self._token_text(self.eos_id))

    def token_bytes(self, token_id):
        """The bytes a token stands for (a control token: its own name)."""
        piece = self.tk.id_to_token(token_id) or ""
        if token_id in self.special:
            return piece.encode()
        if self.byte_level and all(c in self.bytes_of_char for c in piece):
            return bytes(self.bytes_of_char[c] for c in piece)
        return self.tk.decode([token_id], skip_special_tokens=False).encode()

    def token_text(self, token_id):
        return self.token_bytes(token_id).decode("utf-8", "replace")

    def _token_text(self, token_id):
        return (self.tk.id_to_token(token_id) or "") if token_id is not None else ""


def _json_or_empty(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _compile(source):
    import jinja2.sandbox

    def raise_exception(message):
        raise ValueError("chat template: %s" % message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = time.strftime
    return env.from_string(source)


class TextStream:
    """The output text of one request as its tokens come.

    add() takes each sampled token (never the EOS token) and says whether a stop string has
    appeared; the text is then cut where it begins. take() hands out the text that may be sent:
    never a tail that could still grow into a stop string, nor an unfinished UTF-8 sequence,
    unless the request has ended. ends[i] is the length of the text once token i is in."""

    def __init__(self, vocab, stops):
        self.vocab = vocab
        self.stops = [s for s in stops if s]
        self.ids = []
        self.ends = []
        self.text = ""     # the text so far, cut at a stop string when one appeared
        self.stable = 0    # chars of text no later token can change
        self.sent = 0      # chars of text handed out by take()
        self.stopped = False

    def add(self, token_id):
        self.ids.append(token_id)
        text = self.vocab.decode(self.ids)
        stable = len(text.rstrip(REPLACEMENT))
        cut = self._first_stop(text, stable)
        if cut is not None:
            text, stable, self.stopped = text[:cut], cut, True
        self.text, self.stable = text, stable
        self.ends.append(stable)
        return self.stopped

    def _first_stop(self, text, stable):
        """Where the first stop string begins in text[:stable], or None. Text up to the old
        stable end was searched already, so a new match ends past it."""
        best = None
        for s in self.stops:
            i = text.find(s, max(0, self.stable - len(s) + 1), stable)
            if i >= 0 and (best is None or i < best):
                best = i
        return best

    def take(self, final=False):
        """The text not sent yet that may be sent now (all of it when final)."""
        end = len(self.text) if final else self.stable - self._held(self.text[:self.stable])
        end = max(end, self.sent)
        out, self.sent = self.text[self.sent:end], end
        return out

    def _held(self, text):
        """Length of the longest end of text that begins a stop string."""
        longest = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:n]):
                    longest = n
                    break
        return longest

    def tokens_sent(self, final=False):
        """How many tokens go with the text handed out so far: those whose text is all sent;
        once the request has ended, every token, or after a stop string those whose text
        begins before it."""
        if final and not self.stopped:
            return len(self.ids)
        n = 0
        for i, end in enumerate(self.ends):
            start = self.ends[i - 1] if i else 0
            if not (start < len(self.text) if final else end <= self.sent):
                break
            n += 1
        return n
