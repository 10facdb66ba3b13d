"""Chat templates from a model folder, rendered within bounds.

A tokenizer or processor folder carries its chat template as Jinja code (chat_template.jinja,
chat_template.json or tokenizer_config.json), and transformers renders it in a sandbox that stops
a template from reaching Python, but not from looping for ever or building gigabytes: three nested
`range(100000)` loops, or `{{ 'x' * 2000000000 }}`. Here every template a tokenizer or processor
of a model folder renders goes through an environment of HalfSafe's own, the same sandbox with the
same helpers as transformers', that also counts what the template does and refuses, in one
sentence naming its file, a template that

- takes more than MAX_TEMPLATE_STEPS steps (a loop's turn, a call, a lookup, an operator, a filter
  or comparison counted by the items it reads, a macro's call by MACRO_STEPS), or runs longer
  than MAX_TEMPLATE_SECONDS whatever it counts;
- builds more than MAX_TEMPLATE_TEXT characters of text in all (what it writes out and every
  string it makes on the way), or more than MAX_TEMPLATE_ITEMS items of lists;
- makes a number wider than MAX_TEMPLATE_INT_BITS bits, or stops with an error of its own.

Sizes are checked before the work that makes them (a string repeated, padded, replaced or
joined), so a refusal costs milliseconds and at most the bound in memory. The budgets grow with
the prompt: a template may read its input through. `bound` puts a tokenizer's or processor's
`apply_chat_template` on this path (transformers then tokenises the text rendered here, as it
would its own); `render` renders one conversation.

jinja2 is imported here; transformers only inside `bound`'s calls.
"""

from __future__ import annotations

import contextvars
import datetime
import functools
import inspect
import json
import re
import string
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.runtime import LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace, _PassArg
from jinja2.visitor import NodeTransformer

from app.core import limits
from app.core.errors import BadFileError

# Steps one render may take: a real chat template takes a few hundred to lay out a conversation.
MAX_TEMPLATE_STEPS = 100_000
# Characters of text one render may build in all (a real one builds the conversation once or
# twice over), and list items it may make.
MAX_TEMPLATE_TEXT = 4 << 20
MAX_TEMPLATE_ITEMS = 1 << 20
# The longest a render may run whatever it counted: a backstop (real ones take milliseconds).
MAX_TEMPLATE_SECONDS = 3.0
# Steps a macro's call costs: Jinja's call of one does the work of a dozen plain steps.
MACRO_STEPS = 16
# The widest number a template may make (its numbers are indices and lengths).
MAX_TEMPLATE_INT_BITS = 1024
# The longest template rendered: real ones hold 2 to 30 KB.
MAX_TEMPLATE_SOURCE = 256 << 10
# The longest strftime format a template may pass (a date is a few fields).
MAX_DATE_FORMAT = 256

# The files a template folder holds its chat template in, in the order transformers reads them.
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")

# What a refusal says after "<file>: its chat template ".
REFUSALS = {
    "steps": f"takes more than {MAX_TEMPLATE_STEPS:,} steps to lay out one prompt",
    "seconds": f"ran for more than {MAX_TEMPLATE_SECONDS:g} seconds laying out one prompt",
    "text": f"builds more than {MAX_TEMPLATE_TEXT >> 20} million characters of text",
    "items": f"builds lists of more than {MAX_TEMPLATE_ITEMS:,} items",
    "number": f"makes a number wider than {MAX_TEMPLATE_INT_BITS:,} bits",
    "source": f"is longer than the {MAX_TEMPLATE_SOURCE >> 10} KB any real one needs",
    "width": "pads or formats text wider than the text it may build",
}


class TemplateRefused(ValueError):
    """A template went past a bound; `reason` is a key of REFUSALS."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(REFUSALS[reason])


# The budget ------------------------------------------------------------------------------


class _Budget:
    """What one render may still do; its counters only go down."""

    def __init__(self, input_chars: int) -> None:
        self.steps = MAX_TEMPLATE_STEPS + input_chars // 4
        self.text = MAX_TEMPLATE_TEXT + 8 * input_chars
        self.items = MAX_TEMPLATE_ITEMS + input_chars
        self.deadline = time.monotonic() + MAX_TEMPLATE_SECONDS

    def step(self, count: int = 1) -> None:
        self.steps -= count
        if self.steps < 0:
            raise TemplateRefused("steps")
        if time.monotonic() > self.deadline:
            raise TemplateRefused("seconds")

    def build_text(self, count: int) -> None:
        self.text -= count
        if self.text < 0:
            raise TemplateRefused("text")

    def build_items(self, count: int) -> None:
        self.items -= count
        if self.items < 0:
            raise TemplateRefused("items")

    def fits_text(self, count: int) -> None:
        """Refuse, before it is made, text that would go past what is left."""
        if count > self.text:
            raise TemplateRefused("text")

    def fits_items(self, count: int) -> None:
        if count > self.items:
            raise TemplateRefused("items")

    def built(self, value: Any) -> Any:
        """Charge a value just made: a string by its characters, a collection by its items."""
        if isinstance(value, str):
            self.build_text(len(value))
        elif isinstance(value, (list, tuple, dict, set, frozenset)):
            self.build_items(len(value))
        elif isinstance(value, int) and value.bit_length() > MAX_TEMPLATE_INT_BITS:
            raise TemplateRefused("number")
        return value


_ACTIVE: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar(
    "chat_template_budget", default=None
)


def _budget() -> _Budget:
    """The running render's budget. Outside a render (Jinja folding constants while it
    compiles) nothing may be evaluated: the refusal makes Jinja leave it to the render."""
    budget = _ACTIVE.get()
    if budget is None:
        raise TemplateRefused("steps")
    return budget


def text_size(value: Any, cap: int) -> int:
    """An upper bound on the characters str(value) makes, or more than `cap` once it is past
    `cap`, walked without recursion and without making the text."""
    total = 0
    pending = [value]
    seen: set[int] = set()
    while pending and total <= cap:
        item = pending.pop()
        if isinstance(item, str):
            total += len(item) + 2  # a string inside a container is shown quoted
            continue
        if item is None or isinstance(item, (bool, float)):
            total += 24
            continue
        if isinstance(item, int):
            total += item.bit_length() // 3 + 2
            continue
        if id(item) in seen:
            total += 8
            continue
        seen.add(id(item))
        if isinstance(item, Namespace):
            item = object.__getattribute__(item, "_Namespace__attrs")
        if isinstance(item, Mapping):
            total += 2 + 4 * len(item)
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(item)
            pending.extend(item)
        else:
            total += 200  # a range, a loop, a macro, a function: a short repr
    return total


# Checks made before a string or list is built ----------------------------------------------

_PRINTF_WIDTH = re.compile(r"%[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
_NUMBER = re.compile(r"\d+")


def _check_printf(text: str, budget: _Budget) -> None:
    for width, precision in _PRINTF_WIDTH.findall(text):
        for number in (width, precision):
            if number == "*" or (number and int(number) > budget.text):
                raise TemplateRefused("width")


def _check_format_spec(text: str, budget: _Budget) -> None:
    for _, _, spec, _ in string.Formatter().parse(text):
        if spec and ("{" in spec or any(int(n) > budget.text for n in _NUMBER.findall(spec))):
            raise TemplateRefused("width")


def _check_repeat(left: Any, right: Any, budget: _Budget) -> None:
    """`left * right`: a sequence repeated, or a product of numbers."""
    if isinstance(left, int) and not isinstance(left, bool) and not isinstance(right, int):
        left, right = right, left
    if isinstance(right, int) and isinstance(left, (str, list, tuple)):
        size = len(left) * max(right, 0)
        (budget.fits_text if isinstance(left, str) else budget.fits_items)(size)
    elif (
        isinstance(left, int)
        and isinstance(right, int)
        and left.bit_length() + right.bit_length() > MAX_TEMPLATE_INT_BITS
    ):
        raise TemplateRefused("number")


def _check_power(base: Any, exponent: Any) -> None:
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and abs(base) > 1
        and base.bit_length() * exponent > MAX_TEMPLATE_INT_BITS
    ):
        raise TemplateRefused("number")


def _check_binop(operator: str, left: Any, right: Any, budget: _Budget) -> None:
    if operator == "*":
        _check_repeat(left, right, budget)
    elif operator == "**":
        _check_power(left, right)
    elif operator == "+" and isinstance(left, str) and isinstance(right, str):
        budget.fits_text(len(left) + len(right))
    elif operator == "+" and isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
        budget.fits_items(len(left) + len(right))
    elif operator == "%" and isinstance(left, str):
        _check_printf(left, budget)


def _replaced_size(text: str, old: str, new: str, count: int) -> int:
    found = text.count(old) if old else len(text) + 1
    if count >= 0:
        found = min(found, count)
    return len(text) + found * max(len(new) - len(old), 0)


def _check_string_method(name: str, text: str, args: tuple, kwargs: dict, budget: _Budget):
    """The size a str method would make, checked before it runs (those that can outgrow
    their string); its arguments as the method takes them."""
    numbers = [a for a in (*args, *kwargs.values()) if isinstance(a, int)]
    if name in ("center", "ljust", "rjust", "zfill") and numbers:
        budget.fits_text(max(numbers[0], len(text)))
    elif name == "expandtabs":
        tab = numbers[0] if numbers else 8
        budget.fits_text(len(text) + text.count("\t") * max(tab, 0))
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str):
        count = args[2] if len(args) > 2 else kwargs.get("count", -1)
        if isinstance(args[1], str) and isinstance(count, int):
            budget.fits_text(_replaced_size(text, args[0], args[1], count))
    elif name == "join" and args:
        parts = args[0] if isinstance(args[0], (list, tuple)) else None
        if parts is None:
            raise TemplateRefused("width")  # only a list is joined: its size is known first
        budget.fits_text(text_size(parts, budget.text) + len(text) * len(parts))
    elif name == "translate":
        budget.fits_text(len(text) * (1 + text_size(args, budget.text)))


# Filters ----------------------------------------------------------------------------------


def _filter_checks(name: str, value: Any, args: tuple, kwargs: dict, budget: _Budget) -> None:
    """Sizes a filter would make, checked before it runs."""
    numbers = [a for a in (*args, *kwargs.values()) if isinstance(a, int)]
    if name in ("center", "indent", "wordwrap", "truncate") and numbers:
        lines = value.count("\n") + 1 if isinstance(value, str) else 1
        budget.fits_text(max(numbers[0], 0) * lines)
    elif name in ("batch", "slice") and numbers:
        budget.fits_items(max(numbers[0], 0))
    elif name == "replace" and len(args) >= 2 and isinstance(value, str):
        count = args[2] if len(args) > 2 else kwargs.get("count")
        budget.fits_text(
            _replaced_size(value, str(args[0]), str(args[1]), count if count is not None else -1)
        )
    elif name == "format" and isinstance(value, str):
        _check_printf(value, budget)
        budget.fits_text(len(value) + text_size((args, kwargs), budget.text))
    elif name in ("join", "string", "tojson", "pprint", "list", "urlencode", "xmlattr"):
        indent = kwargs.get("indent") or 0
        indent = indent if isinstance(indent, int) else 0
        budget.fits_text(text_size((value, args), budget.text) * (2 + max(indent, 0)))
    elif name == "sum":
        start = args[1] if len(args) > 1 else kwargs.get("start", 0)
        if not isinstance(start, (int, float)):
            raise TemplateRefused("items")  # sum adds numbers; lists added up grow as squares


def _counted(value: Any, budget: _Budget) -> Any:
    """A filter's input, charged by what it reads: a string by the 256 characters, a collection
    by its items now, an iterator item by item as it is read."""
    if isinstance(value, str):
        budget.step(1 + len(value) // 256)
        return value
    if isinstance(value, (list, tuple, dict, set, frozenset, range)):
        budget.step(1 + len(value))
        return value
    if isinstance(value, Iterator):
        return _Counted(value)
    budget.step()
    return value


def _guarded(name: str, function: Callable) -> Callable:
    """A filter or test that charges the budget for what it reads and builds."""
    offset = 1 if _PassArg.from_obj(function) is not None else 0

    @functools.wraps(function)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        for other in (*args[offset + 1 :], *kwargs.values()):
            if isinstance(other, (str, list, tuple, dict, set, frozenset, range)):
                _counted(other, budget)  # `in`, `replace`, `join`... read these too
        if len(args) > offset:
            value = _counted(args[offset], budget)
            _filter_checks(name, value, args[offset + 1 :], kwargs, budget)
            args = (*args[:offset], value, *args[offset + 1 :])
        else:
            budget.step()
        result = function(*args, **kwargs)
        if isinstance(result, Iterator) and not isinstance(result, _Counted):
            return _Counted(result)
        return budget.built(result)

    return guarded


class _Counted:
    """An iterable whose items each cost a step as they are read (a filter's or a call's
    iterator, a loop's sequence)."""

    def __init__(self, iterable: Iterable) -> None:
        self._iterable = iterable
        self._iterator: Iterator | None = None

    def __iter__(self) -> Iterator:
        for item in self._iterable:
            _budget().step()
            yield item

    def __next__(self) -> Any:  # an Iterator still, for filters that call next() on their input
        if self._iterator is None:
            self._iterator = iter(self._iterable)
        _budget().step()
        return next(self._iterator)


class _CountedSequence(_Counted):
    """A loop's sized sequence, counted: its length stays readable (`loop.length`)."""

    def __len__(self) -> int:
        return len(self._iterable)  # pyright: ignore[reportArgumentType]


def _loop_over(iterable: Any) -> _Counted:
    sized = hasattr(type(iterable), "__len__")
    return _CountedSequence(iterable) if sized else _Counted(iterable)


# The environment --------------------------------------------------------------------------


class _TemplateNamespace(Namespace):
    """A namespace whose names never start with "_" (no reaching Python's internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Namespace's own signature
        self, rest = args[0], args[1:]
        attributes = dict(*rest, **kwargs)
        for name in attributes:
            _TemplateNamespace._check(name)
        Namespace.__init__(self, attributes)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a namespace name starts with _: {name!r}")


class _TemplateDict:
    """`dict(...)` and `dict.fromkeys(...)` for templates, without the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message: Any) -> None:
    raise jinja2.exceptions.TemplateError(str(message))


def _strftime_now(format: str) -> str:
    if len(str(format)) > MAX_DATE_FORMAT:
        raise TemplateRefused("width")
    return datetime.datetime.now().strftime(format)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # transformers' tojson: no HTML escaping, and its options.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks what the assistant wrote (for a mask
    HalfSafe never asks for): its body renders as is."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class _Counting(NodeTransformer):
    """Routes a template's loops, output and `~` through the environment's counters."""

    @staticmethod
    def _call(name: str, argument: nodes.Node, lineno: int) -> nodes.Call:
        return nodes.Call(
            nodes.EnvironmentAttribute(name),
            [cast(nodes.Expr, argument)],
            [],
            None,
            None,
            lineno=lineno,
        )

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)  # in place
        node.iter = self._call("halfsafe_loop", node.iter, node.lineno)
        return node

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        self.generic_visit(node)  # in place
        node.nodes = [self._call("halfsafe_output", child, node.lineno) for child in node.nodes]
        return node

    def visit_Compare(self, node: nodes.Compare) -> nodes.Node:
        self.generic_visit(node)  # in place
        node.expr = self._call("halfsafe_read", node.expr, node.lineno)
        for operand in node.ops:
            operand.expr = self._call("halfsafe_read", operand.expr, node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)  # in place
        return self._call("halfsafe_join", nodes.List(node.nodes), node.lineno)


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """transformers' chat template environment (its sandbox, whitespace rules, loop controls,
    generation blocks and helpers), each step of a render counted against the running budget."""

    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self) -> None:
        super().__init__(
            trim_blocks=True,
            lstrip_blocks=True,
            optimized=False,
            extensions=[_Generation, jinja2.ext.loopcontrols],
        )
        self.filters["tojson"] = _tojson
        self.filters = {name: _guarded(name, f) for name, f in self.filters.items()}
        self.tests = {name: _guarded(name, f) for name, f in self.tests.items()}
        self.globals.pop("lipsum", None)  # random text by the paragraph: no template needs it
        self.globals.update(
            raise_exception=_raise_exception,
            strftime_now=_strftime_now,
            dict=_TemplateDict(),
            namespace=_TemplateNamespace,
        )

    # Counters the rewritten template calls (see _Counting).
    def halfsafe_loop(self, iterable: Any) -> _Counted:
        return _loop_over(iterable)

    def halfsafe_read(self, value: Any) -> Any:
        """A compared value, charged by what comparing it reads (`in`, `==` walk it)."""
        _counted(value, _budget())
        return value

    def halfsafe_output(self, value: Any) -> Any:
        budget = _budget()
        budget.build_text(text_size(value, budget.text))
        return value

    def halfsafe_join(self, parts: list) -> str:
        budget = _budget()
        budget.build_text(text_size(parts, budget.text))
        return "".join(str(part) for part in parts)

    # The sandbox's own hooks, counted.
    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        budget = _budget()
        budget.step()
        _check_binop(operator, left, right, budget)
        return budget.built(super().call_binop(context, operator, left, right))

    def getattr(self, obj: Any, attribute: str) -> Any:
        _budget().step()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        budget = _budget()
        budget.step()
        value = super().getitem(obj, argument)
        return budget.built(value) if isinstance(argument, slice) else value

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        text = value.__self__

        def checked(*args: Any, **kwargs: Any) -> str:
            budget = _budget()
            _check_format_spec(text, budget)
            budget.fits_text(len(text) + text_size((args, kwargs), budget.text))
            return budget.built(wrapper(*args, **kwargs))

        return checked

    def call(__self, __context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        budget = _budget()
        budget.step()
        owner = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "")
        if owner is __self:  # a counter of the rewritten template: charges for itself
            return __context.call(__obj, *args, **kwargs)
        if isinstance(owner, str):
            _check_string_method(name, owner, args, kwargs, budget)
        elif isinstance(owner, (list, tuple, dict)) and name in ("index", "count", "copy"):
            budget.step(len(owner))  # each reads the whole
        elif isinstance(__obj, LoopContext) and args:
            args = (_loop_over(args[0]), *args[1:])  # a recursive loop's next level
        elif isinstance(__obj, Macro):
            budget.step(MACRO_STEPS)
        result = super().call(__context, __obj, *args, **kwargs)
        if isinstance(result, Iterator) and not isinstance(result, _Counted):
            return _Counted(result)
        if isinstance(owner, dict) and name == "get":
            return result  # a value the template was given, not one it made
        return budget.built(result)


_ENVIRONMENT = BoundedEnvironment()


@functools.lru_cache(maxsize=16)
def _compiled(source: str) -> jinja2.Template:
    if len(source) > MAX_TEMPLATE_SOURCE:
        raise TemplateRefused("source")
    tree = _ENVIRONMENT.parse(source)
    return _ENVIRONMENT.from_string(_Counting().visit(tree))


def template_variables(source: str) -> frozenset[str]:
    """The names a template reads from its caller (the variables a chat call may set)."""
    from jinja2 import meta

    if len(source) > MAX_TEMPLATE_SOURCE:
        raise TemplateRefused("source")
    return frozenset(meta.find_undeclared_variables(_ENVIRONMENT.parse(source)))


# Rendering --------------------------------------------------------------------------------


def plain(value: Any) -> Any:
    """What a template may see of `value`: JSON's types rebuilt (str, int, float, bool, None,
    lists, tuples and string-keyed maps), anything else (a picture, a tensor) as "<Type>", so a
    template never reaches an object's methods."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(plain(item) for item in value)
    if isinstance(value, list):
        return [plain(item) for item in value]
    return f"<{type(value).__name__}>"


def render(source: str, file: Path, **variables: Any) -> str:
    """The text `source` (the chat template of `file`) lays out from `variables` (messages,
    add_generation_prompt, special tokens...; made plain first). Raises BadFileError naming
    `file` where the template goes past a bound or stops with an error. Runs on the calling
    thread, within MAX_TEMPLATE_SECONDS and the text and list bounds."""
    seen = {name: plain(value) for name, value in variables.items()}
    budget = _Budget(text_size(seen, 1 << 40))
    token = _ACTIVE.set(budget)
    try:
        template = _compiled(source)
        pieces: list[str] = []
        for piece in template.generate(**seen):
            pieces.append(piece)
        return "".join(pieces)
    except TemplateRefused as refused:
        raise BadFileError(file, f"its chat template {refused}, which no real one does.") from None
    except RecursionError:
        raise BadFileError(file, "its chat template nests deeper than Python can follow.") from None
    except MemoryError:
        raise BadFileError(file, "its chat template ran out of memory.") from None
    except Exception as error:  # anything a template raises is the template's failure
        raise BadFileError(file, _failure(error)) from None
    finally:
        _ACTIVE.reset(token)


def _failure(error: Exception) -> str:
    if isinstance(error, jinja2.exceptions.TemplateSyntaxError):
        return f"its chat template is not valid Jinja (line {error.lineno})."
    if isinstance(error, jinja2.exceptions.SecurityError):
        return "its chat template reaches for what the sandbox forbids (Python's internals)."
    if type(error) is jinja2.exceptions.TemplateError:
        return "its chat template stopped with an error of its own (raise_exception)."
    return f"its chat template stopped with an error ({type(error).__name__})."


def template_file(folder: Path) -> Path:
    """The file of `folder` its chat template comes from (transformers' order), or the folder
    itself where none is there (a template HalfSafe ships)."""
    for name in TEMPLATE_FILES:
        if limits.is_regular_file(folder / name):
            return folder / name
    return folder


# A tokenizer's or processor's apply_chat_template --------------------------------------------

# What transformers' apply_chat_template takes beyond a conversation and variables that
# HalfSafe never passes: each would change what a template sees, so a call with one is refused.
_UNUSED_OPTIONS = (
    "tools",
    "documents",
    "continue_final_message",
    "return_assistant_tokens_mask",
    "sanitize_control_tokens",
)
# The rendered text travels to transformers in the conversation's first message, and this
# template gives it back as is: transformers then tokenises it (pictures included) as it would
# its own rendering, and never renders the folder's template itself.
_RENDERED = "halfsafe_rendered_chat"
PASSTHROUGH = "{{ messages[0]['" + _RENDERED + "'] }}"


class BoundedChat:
    """`apply_chat_template` of one tokenizer or processor (`owner`, its template from `file`),
    the template rendered by `render`; everything else as transformers' own method does."""

    def __init__(self, owner: Any, file: Path) -> None:
        self.owner = owner
        self.file = file

    def _source(self, chat_template: str | None) -> str:
        templates = getattr(self.owner, "chat_template", None)
        if isinstance(templates, dict):
            source = templates.get(chat_template or "default", chat_template)
        else:
            source = chat_template or templates
        if not isinstance(source, str):
            raise BadFileError(
                self.file,
                "it holds no chat template, which this model's prompts are laid out with.",
            )
        return source

    def __call__(self, conversation: Any, chat_template: str | None = None, **options: Any):
        for option in _UNUSED_OPTIONS:
            if options.get(option):
                raise ValueError(f"HalfSafe lays out chat prompts without {option}")
        source = self._source(chat_template)
        original = type(self.owner).apply_chat_template
        named = set(inspect.signature(original).parameters)
        extra = {k: v for k, v in options.items() if k not in named}
        batched = isinstance(conversation, (list, tuple)) and bool(conversation)
        batched = batched and isinstance(conversation[0], (list, tuple))
        conversations = list(conversation) if batched else [conversation]
        tokenizer = getattr(self.owner, "tokenizer", self.owner)
        variables = {**getattr(tokenizer, "special_tokens_map", {}), **extra}
        marked = []
        for messages in conversations:
            if not messages or not isinstance(messages[0], Mapping):
                raise ValueError("a chat prompt is a list of messages, each a mapping")
            text = render(
                source,
                self.file,
                messages=messages,
                tools=None,
                documents=None,
                add_generation_prompt=options.get("add_generation_prompt", False),
                **variables,
            )
            marked.append([{**messages[0], _RENDERED: text}, *messages[1:]])
        if tokenizer is not self.owner:  # a processor: the rest are its call's settings
            used = template_variables(source)
            extra = {k: v for k, v in extra.items() if k not in used}
        else:
            extra = {}
        given = {k: v for k, v in options.items() if k in named}
        return original(
            self.owner,
            marked if batched else marked[0],
            chat_template=PASSTHROUGH,
            **given,
            **extra,
        )


def bound(holder: Any, folder: Path) -> Any:
    """Have `holder` (a tokenizer, or a processor and its tokenizer, read from `folder`) render
    its chat templates within bounds (`render`), naming the file they came from when it refuses
    one. Changes only these objects; returns `holder`."""
    file = template_file(folder)
    for owner in (holder, getattr(holder, "tokenizer", None)):
        if owner is None or not callable(getattr(type(owner), "apply_chat_template", None)):
            continue
        if not isinstance(vars(owner).get("apply_chat_template"), BoundedChat):
            owner.apply_chat_template = BoundedChat(owner, file)
    return holder


def bound_pipeline(pipeline: Any, folder: Path) -> None:
    """`bound` for each tokenizer and processor of a pipeline read from `folder` (each from the
    subfolder its part is named after), optional parts included."""
    for name in list(getattr(pipeline, "config", {})):
        part = getattr(pipeline, name, None) if not name.startswith("_") else None
        if part is not None and callable(getattr(type(part), "apply_chat_template", None)):
            bound(part, folder / name)
