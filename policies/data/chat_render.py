# Renders conversations through a model's chat template, set up as
# transformers' `apply_chat_template` sets up Jinja2 (the engine transformers
# itself uses): an immutable sandbox, trim_blocks and lstrip_blocks, loop
# controls, its own `tojson`, and the `raise_exception` and `strftime_now`
# globals. strata embeds this file and runs it as `python3 -I -c SOURCE
# REQUEST.json`; it prints one JSON object and exits 0, or prints why it could
# not start and exits 2.
#
# The template is untrusted input from a model directory. Besides the sandbox
# (no file, import or unsafe attribute access), the process bounds its own
# memory (RLIMIT_AS) and CPU time (RLIMIT_CPU) before it reads the template,
# each render's wall time (an interval timer), and each render's output.
#
# Request: {"template", "variables" (special tokens and template arguments),
#   "date" (ISO 8601: what strftime_now formats), "max_chars", "timeout_s",
#   "memory_bytes", "cpu_seconds", "stop_strings",
#   "items": [{"messages", "add_generation_prompt", "assistant_spans"}]}
# Reply: {"results": [{"text", "spans": [[begin, end], ...]} | {"error"}]}
# Spans are UTF-8 byte offsets into "text" of the assistant turns: from the
# template's {% generation %} marks when it has them, else found by rendering
# the conversation's prefixes (each must render as a prefix of the whole).
import datetime
import json
import resource
import signal
import sys

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError as e:
    print(f"chat templates need Jinja2 for Python 3 (Debian: python3-jinja2): {e}", file=sys.stderr)
    sys.exit(2)


class RenderTimeout(Exception):
    pass


class GenerationMarks(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: records where its body lands in
    the output (as transformers' assistant-mask support reads the tag)."""

    tags = {"generation"}

    def __init__(self, environment):
        super().__init__(environment)
        environment.extend(generation_spans=None, generation_chunks=None)

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_mark", []), [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _mark(self, eval_ctx, caller):
        body = caller()
        env = self.environment
        if env.generation_spans is not None:
            start = sum(len(c) for c in env.generation_chunks)
            env.generation_spans.append((start, start + len(body)))
        return body


def make_environment(date):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers' own tojson: no HTML escaping, unicode kept.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return date.strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationMarks, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def on_alarm(signum, frame):
    raise RenderTimeout()


def render(env, template, variables, messages, add_generation_prompt, max_chars, timeout_s):
    """The text and the {% generation %} spans (character offsets)."""
    chunks, spans = [], []
    env.generation_chunks, env.generation_spans = chunks, spans
    size = 0
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        # transformers passes tools and documents (None without them); the
        # special tokens and template arguments may name them too.
        context = {"tools": None, "documents": None, **variables}
        for chunk in template.generate(messages=messages, add_generation_prompt=add_generation_prompt, **context):
            chunks.append(chunk)
            size += len(chunk)
            if size > max_chars:
                raise jinja2.exceptions.TemplateError(f"the rendered text exceeds {max_chars} characters")
    except RenderTimeout:
        raise jinja2.exceptions.TemplateError(f"rendering took longer than {timeout_s} s")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        env.generation_chunks, env.generation_spans = None, None
    return "".join(chunks), spans


def common_prefix(a, b):
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def prefix_spans(env, template, variables, messages, full, stop_strings, max_chars, timeout_s):
    """Assistant turns found by rendering prefixes: a turn starts where the
    conversation before it, with the generation prompt, ends; it ends where
    the conversation up to it stops agreeing with the whole, cut after its
    last end-of-turn string (what follows one is the template's, not the
    model's)."""
    spans = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        before, _ = render(env, template, variables, messages[:i], True, max_chars, timeout_s)
        upto, _ = render(env, template, variables, messages[: i + 1], False, max_chars, timeout_s)
        start = len(before)
        end = common_prefix(upto, full)
        cuts = [full.rfind(s, start, end) + len(s) for s in stop_strings if s and full.rfind(s, start, end) >= 0]
        if cuts:
            end = max(cuts)
        elif end < len(upto):
            end = start  # the turn's own rendering disagrees with the whole before its end-of-turn
        if not full.startswith(before) or not upto.startswith(before) or end <= start:
            raise ValueError(
                f"message {i} (assistant): rendering the conversation up to this turn does not give a prefix "
                "of the whole conversation (the template rewrites earlier turns); give a template whose "
                "assistant turns are marked with {% generation %} (data.chat_template_file)"
            )
        spans.append((start, end))
    return spans


def byte_offsets(text, spans):
    out = []
    for begin, end in spans:
        b = len(text[:begin].encode("utf-8"))
        out.append([b, b + len(text[begin:end].encode("utf-8"))])
    return out


def write_reply(reply):
    # UTF-8 whatever the locale; a template's lone surrogate becomes U+FFFD.
    sys.stdout.buffer.write(json.dumps(reply, ensure_ascii=False).encode("utf-8", "replace"))


def main():
    with open(sys.argv[1], "rb") as f:
        request = json.loads(f.read().decode("utf-8"))
    memory = int(request.get("memory_bytes", 0))
    if memory > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    cpu = int(request.get("cpu_seconds", 0))
    if cpu > 0:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    signal.signal(signal.SIGALRM, on_alarm)
    date = datetime.datetime.fromisoformat(request["date"])
    max_chars = int(request["max_chars"])
    timeout_s = float(request["timeout_s"])
    variables = request.get("variables", {})
    stop_strings = request.get("stop_strings", [])
    env = make_environment(date)
    results = []
    try:
        template = env.from_string(request["template"])
    except jinja2.exceptions.TemplateError as e:
        write_reply({"error": f"the template does not parse: {e}"})
        return 0
    uses_marks = any(
        node.name == "_mark" for node in env.parse(request["template"]).find_all(jinja2.nodes.ExtensionAttribute)
    )
    for item in request["items"]:
        try:
            messages = item["messages"]
            text, marks = render(
                env, template, variables, messages, item["add_generation_prompt"], max_chars, timeout_s
            )
            result = {"text": text}
            if item.get("assistant_spans"):
                if uses_marks:
                    spans = marks
                else:
                    spans = prefix_spans(env, template, variables, messages, text, stop_strings, max_chars, timeout_s)
                result["spans"] = byte_offsets(text, spans)
            results.append(result)
        except MemoryError:
            results.append({"error": "rendering ran out of memory"})
        except (jinja2.exceptions.TemplateError, ValueError) as e:
            results.append({"error": str(e)})
        except Exception as e:  # a template's runtime fault: TypeError, ...
            results.append({"error": f"{type(e).__name__}: {e}"})
    write_reply({"results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
