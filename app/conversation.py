"""The conversation on screen: its messages, its engine session, its stored history and its own sampling values.

Sending, regenerating, editing the last message, starting over, resuming, the system prompt and exports all
change the same three things together (the view, the store, the session), so one controller owns them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from parley.app import paste_budget
from parley.app.engine_lifecycle import in_background, to_ui
from parley.app.reply_controller import without_marks
from parley.app.screens.dialogs import SystemPromptScreen
from parley.app.settings import apply_values, params_values
from parley.app.store import Conversation, compose_user_content
from parley.app.widgets.message import ChatMessage
from parley.app.widgets.params_panel import REPETITION_DEFAULTS
from parley.engine.params import GenerationParams
from parley.engine.protocol import SessionLike

if TYPE_CHECKING:
    from parley.app.chat_app import ParleyApp


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:48] or "conversation"


class ConversationController:
    """Owns the conversation shown (None before its first message), its session and its sampling values."""

    def __init__(self, app: ParleyApp, system_prompt: str | None) -> None:
        self.app = app
        self.conversation: Conversation | None = None
        saved_system = app.settings.get("system_prompt", "")
        self.system_prompt_draft = system_prompt if system_prompt is not None else str(saved_system or "")
        self.session: SessionLike | None = None
        self.global_params = params_values(app.params)  # restored on a new chat
        self.queued = False  # a message sent while the model loads waits for it

    @property
    def system_prompt(self) -> str:
        return self.conversation.system_prompt if self.conversation else self.system_prompt_draft

    # the engine's view of it
    def engine_ready(self) -> None:
        """An engine is in: count what a resumed conversation takes, answer a message that waited for it."""
        if self.conversation is not None:
            self.count_context()
        if self.queued:
            self.queued = False
            self.app.call_later(self.start_reply)

    def texts(self) -> list[str]:
        return [compose_user_content(m.content, m.attachment) for m in self.app.chat.messages]

    def engine_messages(self) -> list[dict[str, str]]:
        """The visible conversation as the engine wants it: what is on screen is what the model saw."""
        return [{"role": m.role, "content": compose_user_content(without_marks(m.content), m.attachment)}
                for m in self.app.chat.messages]

    def _ensure_conversation(self, first_text: str) -> Conversation:
        if self.conversation is None:
            app = self.app
            title = (first_text.strip().splitlines() or ["Pasted document"])[0][:48]
            self.conversation = app.store.create_conversation(title, self.system_prompt_draft)
            app.sub_title = self.conversation.title
            overrides = self._overrides()
            if overrides:  # values changed before the first message belong to this conversation too
                self._save_overrides(overrides)
        return self.conversation

    def _ensure_session(self) -> SessionLike:
        assert self.app.engine is not None
        if self.session is None:
            self.session = self.app.engine.session(self.system_prompt or None)
        return self.session

    # turns
    async def send(self, text: str) -> None:
        app = self.app
        text = text.strip()
        chip = app.attachment
        if app.engine is None and self.queued:
            app.notify("One message already waits for the model", severity="warning")
            return
        if app.generating:
            app.notify("A reply is streaming: Esc stops it", severity="warning")
            return
        if chip is not None and chip.tokens is None and app.engine is not None:
            app.notify("Still measuring the pasted document", severity="warning")
            return
        if not text and chip is None:
            return
        conversation = self._ensure_conversation(text or "Pasted document")
        doc, doc_tokens, doc_name = (chip.text, chip.tokens, chip.file_name) if chip is not None else (None, None, None)
        message = ChatMessage("user", text, doc, doc_tokens, doc_name)
        message.db_id = app.store.add_message(conversation.id, "user", text, doc)
        await app.chat.mount(message)
        app.prompt.clear()
        await app.attachments.remove()
        if app.engine is None:  # answered as soon as the model is in
            self.queued = True
            app.notify("Queued: answered once the model has loaded")
            return
        await self.start_reply()

    async def start_reply(self) -> None:
        app = self.app
        documents = {i: m.attachment_name or "you pasted" for i, m in enumerate(app.chat.messages)
                     if m.attachment is not None}
        await app.replies.start(self._ensure_session(), self.engine_messages(), app.params, documents)

    async def regenerate(self) -> None:
        app = self.app
        if app.generating or app.engine is None:
            return
        messages = app.chat.messages
        if messages and messages[-1].role == "assistant":
            if messages[-1].db_id is not None:
                app.store.delete_message(messages[-1].db_id)
            await messages[-1].remove()
            messages = messages[:-1]
        if messages and messages[-1].role == "user":
            await self.start_reply()
        else:
            app.notify("Nothing to regenerate yet")

    async def edit_last(self) -> None:
        """Remove the last user message (and what follows) and put it back in the composer."""
        app = self.app
        if app.generating:
            app.notify("Esc stops the reply first", severity="warning")
            return
        messages = app.chat.messages
        users = [i for i, m in enumerate(messages) if m.role == "user"]
        if not users:
            return
        last = messages[users[-1]]
        for m in messages[users[-1]:]:
            if m.db_id is not None:
                app.store.delete_message(m.db_id)
            await m.remove()
        app.prompt.load_text(last.content)
        app.prompt.move_cursor(app.prompt.document.end)
        if last.attachment is not None:
            await app.attachments.attach_text(last.attachment, last.attachment_tokens, last.attachment_name)
        app.prompt.focus()

    # whole conversations
    async def new_chat(self) -> None:
        app = self.app
        await app.replies.stop()
        await app.chat.remove_children()
        self.conversation = None
        self.session = None
        self.queued = False
        app.status.context_used = 0
        self.system_prompt_draft = str(app.settings.get("system_prompt", "") or "")
        app.status.stats = None
        app.sub_title = ""
        self._load_params(self.global_params)
        await app.attachments.remove()
        app.prompt.clear()
        app.prompt.focus()

    async def resume(self, conversation_id: int) -> None:
        app = self.app
        conversation = app.store.conversation(conversation_id)
        if conversation is None:
            return
        await self.new_chat()
        self.conversation = conversation
        app.sub_title = conversation.title
        self._load_params({**self.global_params, **self._overrides()})
        views = []
        for m in app.store.messages(conversation_id):
            view = ChatMessage(m.role, m.content, m.attachment)
            view.db_id = m.id
            views.append(view)
        await app.chat.mount_all(views)
        app.chat.anchor()
        self.count_context()

    def count_context(self) -> None:
        """The tokens a resumed conversation will take in the context (the status bar's `ctx`), counted off
        the UI thread."""
        app, engine, texts = self.app, self.app.engine, self.texts()
        if engine is None:
            return

        def count() -> None:
            used = paste_budget.budget(engine.context_window, sum(engine.count_tokens(t) for t in texts),
                                       max(0, len(texts) - 2), 0).used
            to_ui(app, setattr, app.status, "context_used", used)

        in_background(app, count, "parley-count")

    def renamed(self, conversation_id: int, title: str) -> None:
        if self.conversation and self.conversation.id == conversation_id:
            self.conversation = self.app.store.conversation(conversation_id)
            self.app.sub_title = title

    async def deleted(self, conversation_id: int) -> None:
        if self.conversation and self.conversation.id == conversation_id:
            await self.new_chat()

    def edit_system_prompt(self) -> None:
        app = self.app
        screen = SystemPromptScreen(self.system_prompt)

        def saved(text: str | None) -> None:
            if text is None:
                return
            if self.conversation is not None:
                app.store.set_system_prompt(self.conversation.id, text)
                self.conversation = app.store.conversation(self.conversation.id)
            else:
                self.system_prompt_draft = text
            if screen.as_default:
                app.settings.set("system_prompt", text)  # new conversations start with it
            self.session = None  # the next reply starts a session with the new system prompt
            where = " and for new chats" if screen.as_default else ""
            app.notify(f"System prompt saved for this chat{where}: it applies from the next reply")

        app.push_screen(screen, saved)

    def export(self, conversation_id: int | None = None) -> Path | None:
        """Write a conversation (this one by default) as Markdown in the export folder, and say where."""
        app = self.app
        if conversation_id is None and self.conversation is None:
            app.notify("Nothing to export yet", severity="warning")
            return None
        conversation_id = conversation_id if conversation_id is not None else self.conversation.id
        conversation = app.store.conversation(conversation_id)
        if conversation is None:
            return None
        path = (app.export_dir / f"{slug(conversation.title)}-{conversation_id}.md").resolve()
        try:
            path.write_text(app.store.export_markdown(conversation_id), encoding="utf-8")
        except OSError as e:
            app.notify(f"Could not export to {path}: {e.strerror or e}", severity="error", markup=False)
            return None
        app.notify(f"Exported to {path}", title="Export", timeout=10, markup=False)
        return path

    def copy_last_reply(self, code: bool = False) -> None:
        """Copy the last reply, or its last code block."""
        replies = [m for m in self.app.chat.messages if m.role == "assistant"]
        if replies and code:
            replies[-1].action_copy_code()
        elif replies:
            replies[-1].action_copy_message()

    # sampling values: kept for the next start, and per conversation where it changed them
    def _overrides(self) -> dict[str, object]:
        if self.conversation is None:
            return {}
        saved = self.app.settings.get("conversations", {})
        found = saved.get(str(self.conversation.id), {}) if isinstance(saved, dict) else {}
        return found if isinstance(found, dict) else {}

    def _save_overrides(self, values: dict[str, object]) -> None:
        assert self.conversation is not None
        saved = self.app.settings.get("conversations", {})
        saved = dict(saved) if isinstance(saved, dict) else {}
        saved[str(self.conversation.id)] = values
        self.app.settings.set("conversations", saved)

    def _load_params(self, values: dict[str, object]) -> None:
        apply_values(self.app.params, values)
        self.app.panel.show_values()

    def param_changed(self, attr: str, value: object) -> None:
        """Keep the value: for the next start, and for this conversation when it is resumed."""
        if attr == "seed":
            return
        self.global_params[attr] = value
        self.app.settings.save_params_values(self.global_params)
        if self.conversation is not None:
            self._save_overrides({**self._overrides(), attr: value})

    def reset_params(self) -> None:
        defaults = GenerationParams()
        values = {name: getattr(defaults, name, REPETITION_DEFAULTS.get(name)) for name in self.global_params}
        self.global_params = dict(values)
        self.app.settings.save_params_values(values)
        if self.conversation is not None:
            self._save_overrides({})
        self._load_params(values)
        self.app.notify("Sampling settings reset to defaults")
