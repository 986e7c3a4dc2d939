"""The conversation on screen: its messages, its engine session, its stored history and its own sampling values.

Sending, regenerating, editing the last message, starting over, resuming, the system prompt and exports all
change the same three things together (the view, the store, the session), so one controller owns them.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

from textual.app import App
from textual.message import Message
from textual.screen import Screen

from parley.app import paste_budget
from parley.app.attachments import AttachmentController
from parley.app.engine_lifecycle import EngineLifecycle, in_background, to_ui
from parley.app.reply_controller import ReplyController, without_marks
from parley.app.screens.dialogs import DocumentWontFitScreen, SystemPromptScreen
from parley.app.settings import Settings, apply_values, params_values
from parley.app.store import Conversation, Store, compose_user_content
from parley.app.widgets.message import ChatMessage, ChatView
from parley.app.widgets.params_panel import REPETITION_DEFAULTS, ParamsPanel
from parley.app.widgets.prompt import PromptInput
from parley.app.widgets.status_bar import StatusBar
from parley.engine.params import GenerationParams
from parley.engine.protocol import EngineLike, SessionLike

MODEL_PARAMS = ("temperature", "top_p", "top_k", "min_p")  # what a model may recommend (sampling_defaults.py)
MIN_REPLY_ROOM = 32  # a shorter reply that keeps a document is offered only if it leaves this much room


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:48] or "conversation"


class Titled(Message):
    """The conversation shown has this title ('' for a new chat)."""

    def __init__(self, title: str) -> None:
        super().__init__()
        self.title = title


class ConversationController:
    """Owns the conversation shown (None before its first message), its session and its sampling values.

    It works on the widgets given at mount; the title goes to the screen as a `Titled` message."""

    def __init__(self, store: Store, settings: Settings, params: GenerationParams, export_dir: Path,
                 system_prompt: str | None, *, engines: EngineLifecycle, replies: ReplyController,
                 attachments: AttachmentController, chosen_params: frozenset[str] = frozenset()) -> None:
        self.store, self.settings, self.params, self.export_dir = store, settings, params, export_dir
        self.engines, self.replies, self.attachments = engines, replies, attachments
        self.conversation: Conversation | None = None
        saved_system = settings.get("system_prompt", "")
        self.system_prompt_draft = system_prompt if system_prompt is not None else str(saved_system or "")
        self.session: SessionLike | None = None
        self._session_engine: EngineLike | None = None  # a new engine reads the conversation afresh
        self.global_params = params_values(params)  # restored on a new chat
        # The values the user set (settings, or a flag this run): a model's recommended ones never replace them.
        self.chosen = settings.chosen_params() | set(chosen_params)
        self.recommended: tuple[dict[str, float | int], str] = ({}, "")  # the model's, and where from
        self.queued = False  # a message sent while the model loads waits for it
        self.checking = False  # measuring whether the documents still fit, before a reply starts
        self.screen: Screen
        self.chat: ChatView
        self.prompt: PromptInput
        self.status: StatusBar
        self.panel: ParamsPanel

    def mount(self, screen: Screen, chat: ChatView, prompt: PromptInput, status: StatusBar,
              panel: ParamsPanel) -> None:
        self.screen, self.chat, self.prompt, self.status, self.panel = screen, chat, prompt, status, panel

    @property
    def ui(self) -> App:
        """Textual's services that only the App has: pushing screens, calls from other threads."""
        return self.screen.app


    def _title(self, title: str) -> None:
        self.screen.post_message(Titled(title))

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
            self.screen.call_later(self.start_reply)

    def texts(self) -> list[str]:
        return [compose_user_content(m.content, m.attachment) for m in self.chat.messages]

    def engine_messages(self) -> list[dict[str, str]]:
        """The visible conversation as the engine wants it: what is on screen is what the model saw."""
        return [{"role": m.role, "content": compose_user_content(without_marks(m.content), m.attachment)}
                for m in self.chat.messages]

    def _ensure_conversation(self, first_text: str) -> Conversation:
        if self.conversation is None:
            title = (first_text.strip().splitlines() or ["Pasted document"])[0][:48]
            self.conversation = self.store.create_conversation(title, self.system_prompt_draft)
            self._title(self.conversation.title)
            overrides = self._overrides()
            if overrides:  # values changed before the first message belong to this conversation too
                self._save_overrides(overrides)
        return self.conversation

    def _ensure_session(self, engine: EngineLike) -> SessionLike:
        if self.session is None or self._session_engine is not engine:
            self.session, self._session_engine = engine.session(self.system_prompt or None), engine
        return self.session

    # turns
    async def send(self, text: str) -> None:
        text = text.strip()
        chip, engine = self.attachments.chip, self.engines.engine
        if engine is None and self.queued:
            self.prompt.notify("One message already waits for the model", severity="warning")
            return
        if self.replies.busy or self.checking:
            self.prompt.notify("A reply is streaming: Esc stops it", severity="warning")
            return
        if chip is not None and chip.tokens is None and engine is not None:
            self.prompt.notify("Still measuring the pasted document", severity="warning")
            return
        if not text and chip is None:
            return
        conversation = self._ensure_conversation(text or "Pasted document")
        doc, doc_tokens, doc_name = (chip.text, chip.tokens, chip.file_name) if chip is not None else (None, None, None)
        message = ChatMessage("user", text, doc, doc_tokens, doc_name)
        message.db_id = self.store.add_message(conversation.id, "user", text, doc)
        await self.chat.mount(message)
        self.prompt.clear()
        await self.attachments.remove()
        if engine is None:  # answered as soon as the model is in
            self.queued = True
            self.prompt.notify("Queued: answered once the model has loaded")
            return
        await self.start_reply()

    async def start_reply(self, reply_tokens: int | None = None, checked: bool = False) -> None:
        """Start the reply; first, off the UI thread, check that no document would be left out (if one
        would, the user chooses: a shorter reply that keeps it, without it, or edit the question)."""
        engine = self.engines.engine
        assert engine is not None and self.conversation is not None
        documents = {i: m.attachment_name or "you pasted" for i, m in enumerate(self.chat.messages)
                     if m.attachment is not None and not m.left_out}
        messages, params = self.engine_messages(), self.params
        if documents and not checked:
            self.checking = True
            system, ui = self.system_prompt, self.ui

            def count() -> None:
                counts = [engine.count_tokens(m["content"]) for m in messages]
                to_ui(ui, self._fits, engine, counts, [m["role"] for m in messages], documents,
                      engine.count_tokens(system) if system else 0)

            in_background(count, "parley-fit")
            return
        if reply_tokens is not None:  # this reply only: the slider keeps the user's value
            params = copy.copy(params)
            params.max_new_tokens = reply_tokens
        self.status.context_documents = sum(m.attachment_tokens or 0 for m in self.chat.messages
                                            if m.attachment is not None and not m.left_out)
        self.status.reply_room = min(params.max_new_tokens, engine.context_window // 4)
        await self.replies.start(engine, self._ensure_session(engine), self.conversation.id,
                                 messages, params, documents)

    async def _fits(self, engine: EngineLike, counts: list[int], roles: list[str], documents: dict[int, str],
                    system_tokens: int) -> None:
        """On the UI thread, after counting on a worker: start, or ask first if a document would be dropped."""
        window = engine.context_window
        dropped = paste_budget.left_out(counts, roles, set(documents), window, self.params.max_new_tokens,
                                        system_tokens)
        lost = [i for i in dropped if i in documents]
        if not lost or engine is not self.engines.engine:
            self.checking = False
            if engine is self.engines.engine:
                await self.start_reply(checked=True)
            return
        room = paste_budget.reply_room(counts, roles, set(documents), window, system_tokens)
        names = ", ".join(documents[i] for i in lost)
        reserve = min(self.params.max_new_tokens, window // 4)
        message = (f"The document {names} ({sum(counts[i] for i in lost):,} tokens), this chat and the "
                   f"{reserve:,} tokens kept for the reply do not fit the model's {window:,}-token window.\n\n"
                   + (f"Keep it: the reply may then be up to {room:,} tokens long (this reply only). "
                      if room >= MIN_REPLY_ROOM else "Even a short reply would not fit beside it. ")
                   + "Or send without it: the model no longer sees it (it stays on screen).")

        async def decided(choice: str | None) -> None:
            self.checking = False
            if choice == "shorten":
                await self.start_reply(reply_tokens=room, checked=True)
            elif choice == "leave":
                for i in lost:
                    self.chat.messages[i].mark_left_out()
                await self.start_reply(checked=True)
            else:
                await self.edit_last()

        self.ui.push_screen(DocumentWontFitScreen(message, room if room >= MIN_REPLY_ROOM else None), decided)

    async def regenerate(self) -> None:
        if self.replies.busy or self.engines.engine is None:
            return
        messages = self.chat.messages
        if messages and messages[-1].role == "assistant":
            if messages[-1].db_id is not None:
                self.store.delete_message(messages[-1].db_id)
            await messages[-1].remove()
            messages = messages[:-1]
        if messages and messages[-1].role == "user":
            await self.start_reply()
        else:
            self.prompt.notify("Nothing to regenerate yet")

    async def edit_last(self) -> None:
        """Remove the last user message (and what follows) and put it back in the composer."""
        if self.replies.busy:
            self.prompt.notify("Esc stops the reply first", severity="warning")
            return
        messages = self.chat.messages
        users = [i for i, m in enumerate(messages) if m.role == "user"]
        if not users:
            return
        last = messages[users[-1]]
        for m in messages[users[-1]:]:
            if m.db_id is not None:
                self.store.delete_message(m.db_id)
            await m.remove()
        self.prompt.load_text(last.content)
        self.prompt.move_cursor(self.prompt.document.end)
        if last.attachment is not None:
            await self.attachments.attach_text(last.attachment, last.attachment_tokens, last.attachment_name)
        self.prompt.focus()

    # whole conversations
    async def new_chat(self) -> None:
        await self.replies.stop()
        await self.chat.remove_children()
        self.conversation = None
        self.session = None
        self.queued = self.checking = False
        self.status.context_used = self.status.context_documents = 0
        self.system_prompt_draft = str(self.settings.get("system_prompt", "") or "")
        self.status.stats = None
        self._title("")
        self._load_params(self.global_params)
        await self.attachments.remove()
        self.prompt.clear()
        self.prompt.focus()

    async def resume(self, conversation_id: int) -> None:
        conversation = self.store.conversation(conversation_id)
        if conversation is None:
            return
        await self.new_chat()
        self.conversation = conversation
        self._title(conversation.title)
        self._load_params({**self.global_params, **self._overrides()})
        views = []
        for m in self.store.messages(conversation_id):
            view = ChatMessage(m.role, m.content, m.attachment)
            view.db_id = m.id
            views.append(view)
        await self.chat.mount_all(views)
        self.chat.anchor()
        self.count_context()

    def count_context(self) -> None:
        """The tokens a resumed conversation will take in the context (the status bar's `ctx`), counted off
        the UI thread."""
        engine, texts, status = self.engines.engine, self.texts(), self.status
        if engine is None:
            return

        def count() -> None:
            used = paste_budget.budget(engine.context_window, sum(engine.count_tokens(t) for t in texts),
                                       max(0, len(texts) - 2), 0).used
            to_ui(ui, setattr, status, "context_used", used)

        ui = self.ui
        in_background(count, "parley-count")

    def renamed(self, conversation_id: int, title: str) -> None:
        if self.conversation and self.conversation.id == conversation_id:
            self.conversation = self.store.conversation(conversation_id)
            self._title(title)

    async def deleted(self, conversation_id: int) -> None:
        if self.conversation and self.conversation.id == conversation_id:
            await self.new_chat()

    def edit_system_prompt(self) -> None:
        screen = SystemPromptScreen(self.system_prompt)

        def saved(text: str | None) -> None:
            if text is None:
                return
            if self.conversation is not None:
                self.store.set_system_prompt(self.conversation.id, text)
                self.conversation = self.store.conversation(self.conversation.id)
            else:
                self.system_prompt_draft = text
            if screen.as_default:
                self.settings.set("system_prompt", text)  # new conversations start with it
            self.session = None  # the next reply starts a session with the new system prompt
            where = " and for new chats" if screen.as_default else ""
            self.prompt.notify(f"System prompt saved for this chat{where}: it applies from the next reply")

        self.ui.push_screen(screen, saved)

    def export(self, conversation_id: int | None = None) -> Path | None:
        """Write a conversation (this one by default) as Markdown in the export folder, and say where."""
        if conversation_id is None and self.conversation is None:
            self.prompt.notify("Nothing to export yet", severity="warning")
            return None
        conversation_id = conversation_id if conversation_id is not None else self.conversation.id
        conversation = self.store.conversation(conversation_id)
        if conversation is None:
            return None
        path = (self.export_dir / f"{slug(conversation.title)}-{conversation_id}.md").resolve()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(self.store.export_markdown(conversation_id), encoding="utf-8")
        except OSError as e:
            self.prompt.notify(f"Could not export to {path}: {e.strerror or e}", severity="error", markup=False)
            return None
        self.prompt.notify(f"Exported to {path}", title="Export", timeout=10, markup=False)
        return path

    def copy_last_reply(self, code: bool = False) -> None:
        """Copy the last reply, or its last code block."""
        replies = [m for m in self.chat.messages if m.role == "assistant"]
        if replies and code:
            replies[-1].action_copy_code()
        elif replies:
            replies[-1].action_copy_message()

    # sampling values: kept for the next start, and per conversation where it changed them
    def _overrides(self) -> dict[str, object]:
        if self.conversation is None:
            return {}
        saved = self.settings.get("conversations", {})
        found = saved.get(str(self.conversation.id), {}) if isinstance(saved, dict) else {}
        return found if isinstance(found, dict) else {}

    def _save_overrides(self, values: dict[str, object]) -> None:
        assert self.conversation is not None
        saved = self.settings.get("conversations", {})
        saved = dict(saved) if isinstance(saved, dict) else {}
        saved[str(self.conversation.id)] = values
        self.settings.set("conversations", saved)

    def _load_params(self, values: dict[str, object]) -> None:
        apply_values(self.params, values)
        self.panel.show_values()

    def model_defaults(self, values: dict[str, float | int], source: str) -> None:
        """A model came in: its recommended sampling values replace those the user never set (the engine's
        defaults for those the last one recommended), and the panel says where they come from."""
        before, self.recommended = self.recommended[0], (values, source)
        base = GenerationParams()
        # A value the last model recommended goes back to the engine's default; the others stay as they are.
        changed = {name: values.get(name, getattr(base, name)) for name in MODEL_PARAMS
                   if name not in self.chosen and (name in values or name in before)}
        if changed:
            self.global_params.update(changed)
            self._load_params({**self.global_params, **self._overrides()})
        self.panel.show_recommended({k: v for k, v in values.items() if k not in self.chosen}, source)

    def param_changed(self, attr: str, value: object) -> None:
        """Keep the value: for the next start, and for this conversation when it is resumed."""
        if attr == "seed":
            return
        self.global_params[attr] = value
        if attr not in self.chosen:  # from now on the user's, whatever a model recommends
            self.chosen.add(attr)
            self.settings.set_chosen_params(self.chosen)
            values, source = self.recommended
            self.panel.show_recommended({k: v for k, v in values.items() if k not in self.chosen}, source)
        self.settings.save_params_values(self.global_params)
        if self.conversation is not None:
            self._save_overrides({**self._overrides(), attr: value})

    def reset_params(self) -> None:
        """Back to the defaults: the model's recommended values where it has them, the engine's elsewhere."""
        defaults = GenerationParams()
        recommended, source = self.recommended
        values = {name: recommended.get(name, getattr(defaults, name, REPETITION_DEFAULTS.get(name)))
                  for name in self.global_params}
        self.global_params = dict(values)
        self.chosen = set()
        self.settings.set_chosen_params(self.chosen)
        self.settings.save_params_values(values)
        if self.conversation is not None:
            self._save_overrides({})
        self._load_params(values)
        self.panel.show_recommended(recommended, source)
        self.prompt.notify("Sampling settings reset to defaults" + (f" ({source})" if recommended else ""))
