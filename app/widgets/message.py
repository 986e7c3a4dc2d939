"""One turn of the conversation, and the scrolling view that holds them."""

from __future__ import annotations

import re

from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Label, Markdown, Static
from textual.widgets.markdown import MarkdownStream

_FENCE = re.compile(r"^(`{3,}|~{3,})[^\n]*\n(.*?)^\1[ \t]*$", re.DOTALL | re.MULTILINE)


def code_blocks(markdown: str) -> list[str]:
    """The contents of the fenced code blocks in a Markdown text, in order."""
    return [m.group(2).rstrip("\n") for m in _FENCE.finditer(markdown)]


def _hard_breaks(state: StateCore) -> None:
    for token in state.tokens:
        for child in token.children or ():
            if child.type == "softbreak":
                child.type = "hardbreak"


def chat_markdown() -> MarkdownIt:
    """Textual's Markdown parser, with every single newline a line break: a model writes a poem or a plain
    list one line per line, not as a paragraph to be reflowed (code blocks are untouched: not inline text)."""
    parser = MarkdownIt("gfm-like")
    parser.core.ruler.push("hard_breaks", _hard_breaks)
    return parser


def attachment_label(text: str, tokens: int | None, *, counting: bool = True, name: str | None = None) -> str:
    """'pasted: 214 lines, 1,870 tokens' (or 'report.md: …' for an opened file): a document in brief."""
    lines = text.count("\n") + 1
    if tokens is not None:
        count = f"{tokens:,} tokens"
    else:
        count = "counting tokens…" if counting else f"{len(text):,} characters"
    return f"{name or 'pasted'}: {lines:,} line{'s' if lines != 1 else ''}, {count}"


DRAFTS_NOTE = "Plain text, with the tokens guessed by speculation highlighted · Ctrl+T: back to formatted"


class ChatMessage(Vertical, can_focus=True):
    """A user or assistant turn. An assistant turn can stream: deltas go through a `MarkdownStream`."""

    BINDINGS = [
        Binding("c", "copy_message", "Copy", tooltip="Copy this message"),
        Binding("y", "copy_code", "Copy code", tooltip="Copy its code block (again: the one before)"),
    ]

    def __init__(self, role: str, content: str = "", attachment: str | None = None,
                 attachment_tokens: int | None = None, attachment_name: str | None = None) -> None:
        super().__init__(classes=f"message -{role}")
        self.role = role
        self.content = content
        self.attachment = attachment
        self.attachment_tokens = attachment_tokens
        self.attachment_name = attachment_name  # the file's name, when it was opened rather than pasted
        self.db_id: int | None = None
        self.left_out = False  # its document is no longer sent to the model (the user chose so)
        self.drafted: list[tuple[int, int]] = []  # (start, end) of characters from accepted draft tokens
        self._stream: MarkdownStream | None = None
        self._code_index = 0

    def compose(self) -> ComposeResult:
        yield Label("You" if self.role == "user" else "Assistant", classes="message--role")
        if self.attachment is not None:
            label = attachment_label(self.attachment, self.attachment_tokens, counting=False,
                                     name=self.attachment_name)
            yield Label(label, classes="message--attachment", markup=False)
        yield Markdown(self.content, classes="message--body", parser_factory=chat_markdown)
        if self.role == "assistant":
            # The optional "colour drafted tokens" view, under a line saying why the reply looks raw: the
            # setting persists, and a user who forgot turning it on must see what it is and how to undo it.
            yield Static(DRAFTS_NOTE, classes="message--drafts-note", markup=False)
            yield Static(classes="message--drafts")

    def mark_left_out(self) -> None:
        """The document stays on screen and in the history, but its label says the model no longer sees it."""
        self.left_out = True
        for label in self.query(".message--attachment").results(Label):
            label.update(attachment_label(self.attachment or "", self.attachment_tokens, counting=False,
                                          name=self.attachment_name) + " · left out: the model no longer sees it")
            label.add_class("-left-out")

    def drafts_text(self) -> Text:
        """The reply as plain text, with the characters that came from accepted drafts highlighted."""
        text = Text(self.content)
        for start, end in self.drafted:
            text.stylize("reverse", start, end)
        return text

    def show_drafts(self) -> None:
        for view in self.query(".message--drafts").results(Static):
            view.update(self.drafts_text())

    @property
    def body(self) -> Markdown:
        return self.query_one(".message--body", Markdown)

    def start_stream(self) -> None:
        self.add_class("-streaming")
        self._stream = Markdown.get_stream(self.body)

    async def append(self, text: str, drafted: list[tuple[int, int]] | None = None) -> None:
        """Append a batch of deltas. Incremental: the stream only re-parses the tail."""
        offset = len(self.content)
        self.drafted.extend((offset + a, offset + b) for a, b in drafted or ())
        self.content += text
        if self._stream is not None:
            await self._stream.write(text)
        if self.parent is not None and self.parent.has_class("-show-drafts"):
            self.show_drafts()

    async def finish(self) -> None:
        """End the stream, then render the whole text once, so code fences close and highlight."""
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self.remove_class("-streaming")
        await self.body.update(self.content)

    def action_copy_message(self) -> None:
        self.app.copy_to_clipboard(self.content)
        self.notify("Message copied")

    def action_copy_code(self) -> None:
        """Copy the last code block; pressing again walks back through the earlier ones."""
        blocks = code_blocks(self.content)
        if not blocks:
            self.notify("No code block in this message", severity="warning")
            return
        index = len(blocks) - 1 - (self._code_index % len(blocks))
        self._code_index += 1
        self.app.copy_to_clipboard(blocks[index])
        self.notify(f"Code block {index + 1} of {len(blocks)} copied")


class ChatView(VerticalScroll):
    """The conversation. Anchored to the bottom; scrolling up releases the anchor (Textual's own rule)."""

    def on_mount(self) -> None:
        self.anchor()

    def toggle_drafts(self) -> bool:
        """Switch every reply between its formatted view and the "drafted tokens coloured" one; True when on."""
        self.toggle_class("-show-drafts")
        on = self.has_class("-show-drafts")
        if on:
            for m in self.messages:
                m.show_drafts()
        return on

    @property
    def messages(self) -> list[ChatMessage]:
        return list(self.query_children(ChatMessage))
