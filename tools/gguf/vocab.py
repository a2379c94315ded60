"""vocab.py - a GGUF file's own text conventions in Python: its byte-level BPE vocabulary as a
`tokenizers` tokenizer, and its chat template rendered (jinja2, sandboxed) for one user message.
devio computes on token ids only; its checks and examples tokenize with this."""

CONTROL, USER_DEFINED = 3, 4


def build_tokenizer(meta):
    """A tokenizers.Tokenizer for a GGUF's byte-level BPE vocabulary."""
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"--prompt needs a byte-level BPE vocabulary (tokenizer.ggml.model "
                         f"'gpt2'); this file has {meta.get('tokenizer.ggml.model')!r}")
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    tokens = meta["tokenizer.ggml.tokens"]
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ValueError("tokenizer.ggml.tokens has duplicates")
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if meta.get("tokenizer.ggml.pre") == "smollm":
        # SmolLM's pre-tokenizer splits every digit apart before the GPT-2 pattern
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tk.pre_tokenizer = byte_level
    tk.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type") or []
    tk.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                           for i, t in enumerate(types) if t == CONTROL])
    tk.add_tokens([AddedToken(tokens[i], normalized=False)
                   for i, t in enumerate(types) if t == USER_DEFINED])
    return tk


def render_chat(meta, user_text):
    """The chat template applied to one user message, with the generation prompt."""
    tpl = meta.get("tokenizer.chat_template")
    if not tpl:
        raise ValueError("the file has no tokenizer.chat_template (use --no-template)")
    import jinja2.sandbox
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    tokens = meta.get("tokenizer.ggml.tokens", [])

    def tok(key):
        i = meta.get(key)
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else ""

    def raise_exception(msg):
        raise ValueError(f"chat template: {msg}")

    return env.from_string(tpl).render(
        messages=[{"role": "user", "content": user_text}], add_generation_prompt=True,
        bos_token=tok("tokenizer.ggml.bos_token_id"), eos_token=tok("tokenizer.ggml.eos_token_id"),
        raise_exception=raise_exception)


def encode_prompt(meta, text, template=True):
    tk = build_tokenizer(meta)
    if template:
        text = render_chat(meta, text)
    ids = tk.encode(text, add_special_tokens=False).ids
    bos = meta.get("tokenizer.ggml.bos_token_id")
    if meta.get("tokenizer.ggml.add_bos_token") and bos is not None and (not ids or ids[0] != bos):
        ids = [bos] + ids
    return tk, text, ids
