"""Past conversations: search, resume, rename, delete, export."""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, Label, OptionList
from textual.widgets.option_list import Option

from parley.app.store import Conversation, Store


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


class Renamed(Message):
    def __init__(self, conversation_id: int, title: str) -> None:
        super().__init__()
        self.conversation_id = conversation_id
        self.title = title


class Deleted(Message):
    def __init__(self, conversation_id: int) -> None:
        super().__init__()
        self.conversation_id = conversation_id


class ExportAsked(Message):
    def __init__(self, conversation_id: int) -> None:
        super().__init__()
        self.conversation_id = conversation_id


class HistoryScreen(ModalScreen[int | None]):
    """Dismisses with the id of the conversation to resume, or None."""

    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("r", "rename", "Rename"),
        Binding("d", "delete", "Delete"),
        Binding("x", "export", "Export .md"),
        Binding("slash", "search", "Search"),
        Binding("down", "to_list", "The matches", show=False),
    ]

    def __init__(self, store: Store, current: int | None) -> None:
        super().__init__()
        self.store = store
        self.current = current
        self._confirm_delete: int | None = None
        self._texts: dict[int, str] | None = None  # conversation id -> its title and messages, lowercased

    def compose(self) -> ComposeResult:
        with Vertical(id="history-box"):
            yield Label("History · Enter resumes · / searches", id="history-title")
            yield Input(placeholder="Search titles and messages (/)", id="history-search")
            yield OptionList(id="history-list")
            yield Input(placeholder="New title, Enter to save", id="history-rename")
        yield Footer()

    def on_mount(self) -> None:
        self._reload()
        self.query_one("#history-rename", Input).display = False
        self.query_one("#history-list").focus()

    def _matches(self, query: str) -> set[int]:
        if self._texts is None:
            self._texts = {
                conv.id: "\n".join([conv.title, *(m.content for m in self.store.messages(conv.id))]).lower()
                for conv in self.store.conversations()
            }
        return {cid for cid, text in self._texts.items() if query in text}

    def _reload(self) -> None:
        options = self.query_one("#history-list", OptionList)
        highlighted = options.highlighted
        options.clear_options()
        query = self.query_one("#history-search", Input).value.strip().lower()
        found = self._matches(query) if query else None
        for conv in self.store.conversations():
            if found is None or conv.id in found:
                options.add_option(Option(self._prompt(conv), id=str(conv.id)))
        if options.option_count:
            options.highlighted = min(highlighted or 0, options.option_count - 1)
        else:
            options.add_option(Option("No match" if query else "No conversations yet", disabled=True))

    def action_search(self) -> None:
        self.query_one("#history-search", Input).focus()

    def action_to_list(self) -> None:
        """Down in the search box: on to the matches (Enter there resumes the highlighted one)."""
        if self.query_one("#history-search", Input).has_focus:
            self.query_one("#history-list").focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "history-search":
            self._reload()

    def _prompt(self, conv: Conversation) -> Text:
        mark = "● " if conv.id == self.current else "  "
        return Text.assemble(mark + conv.title, ("  " + _when(conv.updated_at), "dim"))

    def _selected(self) -> int | None:
        options = self.query_one("#history-list", OptionList)
        if options.highlighted is None:
            return None
        option = options.get_option_at_index(options.highlighted)
        return int(option.id) if option.id else None

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option.id:
            self.dismiss(int(event.option.id))

    def action_close(self) -> None:
        rename = self.query_one("#history-rename", Input)
        if self.query_one("#history-search", Input).has_focus:
            self.query_one("#history-list").focus()
        elif rename.display:
            rename.display = False
            self.query_one("#history-list").focus()
        else:
            self.dismiss(None)

    def action_rename(self) -> None:
        conv_id = self._selected()
        if conv_id is None:
            return
        conv = self.store.conversation(conv_id)
        rename = self.query_one("#history-rename", Input)
        rename.value = conv.title if conv else ""
        rename.display = True
        rename.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "history-search":  # Enter in the search box resumes the first match
            if (conv_id := self._selected()) is not None:
                self.dismiss(conv_id)
            return
        conv_id = self._selected()
        title = event.value.strip()
        if conv_id is not None and title:
            self.store.rename(conv_id, title)
            self._texts = None
            self.app.post_message(Renamed(conv_id, title))
        event.input.display = False
        self._reload()
        self.query_one("#history-list").focus()

    def action_delete(self) -> None:
        conv_id = self._selected()
        if conv_id is None:
            return
        if self._confirm_delete != conv_id:
            self._confirm_delete = conv_id
            self.notify("Press d again to delete this conversation", severity="warning")
            return
        self._confirm_delete = None
        self.store.delete(conv_id)
        self._texts = None
        self.app.post_message(Deleted(conv_id))
        self._reload()

    def action_export(self) -> None:
        conv_id = self._selected()
        if conv_id is not None:
            self.app.post_message(ExportAsked(conv_id))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # Letters type into the rename and search boxes while they have focus.
        if action in ("rename", "delete", "export", "search"):
            return not isinstance(self.focused, Input)
        return True
