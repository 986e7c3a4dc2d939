"""The Parley chat app: conversation, composer, live sampling panel, status bar.

`ParleyApp` composes the screen, binds keys and hands off: loading and switching engines live in
`EngineLifecycle` (engine_lifecycle.py), a reply's lifecycle in `ReplyController` (reply_controller.py),
pasted and opened documents in `AttachmentController` (attachments.py), paste arithmetic in
paste_budget.py, settings in settings.py. The engine loads and replies in thread workers; the UI thread
never waits on the model.
"""

from __future__ import annotations

import re
from pathlib import Path

from textual import events, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.theme import Theme
from textual.widgets import Footer, Header, Input, Select, TextArea
from textual.worker import Worker

from parley.app import paste_budget
from parley.app.attachments import AttachmentController
from parley.app.commands import ParleyCommands
from parley.app.engine_lifecycle import EngineLifecycle, EngineLoader, EngineUpgrade, ModelLoader
from parley.app.reply_controller import ReplyController, without_marks
from parley.app.screens.dialogs import SystemPromptScreen
from parley.app.screens.help import HelpScreen
from parley.app.screens.history import Deleted, HistoryScreen, Renamed
from parley.app.screens.model_picker import RECENT_KEY, remember
from parley.app.settings import Settings, apply_values, params_values
from parley.app.store import Conversation, Store, compose_user_content
from parley.app.widgets.attachment import Attachment
from parley.app.widgets.message import ChatMessage, ChatView
from parley.app.widgets.params_panel import REPETITION_DEFAULTS, ParamsPanel
from parley.app.widgets.prompt import PromptInput
from parley.app.widgets.slider import Slider
from parley.app.widgets.status_bar import StatusBar
from parley.engine.params import GenerationParams
from parley.engine.protocol import EngineLike, SessionLike


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:48] or "conversation"


class ParleyApp(App[int]):
    """A terminal chat over an engine. The engine comes from `load_engine(progress)`."""

    CSS_PATH = Path(__file__).parent / "parley.tcss"  # absolute, so subclasses elsewhere keep it
    TITLE = "Parley"
    COMMANDS = App.COMMANDS | {ParleyCommands}
    # The tooltip is the command palette's title and the help screen's line for each key.
    BINDINGS = [
        Binding("escape", "stop", "Stop", tooltip="Stop the reply (keeps what was shown); back to the prompt"),
        Binding("ctrl+n", "new_chat", "New", tooltip="New chat"),
        Binding("ctrl+r", "regenerate", "Regen", tooltip="Regenerate the last reply"),
        Binding("ctrl+g", "edit_last", "Edit last", show=False,
                tooltip="Edit and resend your last message (also ↑ in an empty prompt)"),
        Binding("f2", "toggle_params", "Sliders", tooltip="Toggle the sampling panel (sliders: ←/→, Home/End, mouse)"),
        Binding("f3", "history", "History", tooltip="History: resume, search, rename, delete, export"),
        Binding("f4", "system_prompt", "System", show=False, tooltip="Edit the system prompt"),
        Binding("ctrl+o", "open_file", "Open file", show=False, tooltip="Attach a file by its path"),
        Binding("f9", "export", "Export", show=False, tooltip="Export this conversation as Markdown"),
        Binding("ctrl+b", "copy_reply", "Copy reply", show=False, tooltip="Copy the last reply (OSC 52)"),
        Binding("ctrl+l", "copy_code", "Copy code", show=False, tooltip="Copy the last code block of the last reply"),
        Binding("ctrl+t", "toggle_drafts", "Drafts", show=False,
                tooltip="Colour the tokens that came from accepted drafts (on/off)"),
        Binding("f8", "reset_params", "Defaults", show=False, tooltip="Reset sampling settings to defaults"),
        Binding("f5", "pick_model", "Model", show=False,
                tooltip="Switch model: a cached or recent one, or a hub id or path (the chat carries over)"),
        Binding("f12", "speculation", "Speculation", show=False,
                tooltip="Speculation: how replies are sped up, explained (sampling panel)"),
        Binding("f1", "help", "Help", tooltip="Show all keys"),
    ]

    generating: reactive[bool] = reactive(False, init=False)

    def __init__(
        self,
        load_engine: EngineLoader,
        *,
        upgrade_engine: EngineUpgrade | None = None,
        load_model: ModelLoader | None = None,
        model_ref: str | None = None,
        store: Store | None = None,
        settings: Settings | None = None,
        params: GenerationParams | None = None,
        system_prompt: str | None = None,
        export_dir: Path | None = None,
        batch_interval: float = 0.04,
    ) -> None:
        super().__init__()
        self.model_ref = model_ref
        self.store = store if store is not None else Store()
        self.settings = settings if settings is not None else Settings()
        self.params = params if params is not None else self.settings.params()
        self._global_params = params_values(self.params)  # restored on a new chat
        self.export_dir = Path(export_dir) if export_dir is not None else Path.cwd()
        self.engine: EngineLike | None = None  # set by `engines`, read by everyone
        self.conversation: Conversation | None = None
        saved_system = self.settings.get("system_prompt", "")
        self._system_prompt_draft = system_prompt if system_prompt is not None else str(saved_system or "")
        self._session: SessionLike | None = None
        self.engines = EngineLifecycle(self, load_engine, upgrade_engine, load_model)
        self.replies = ReplyController(self, batch_interval)
        self.attachments = AttachmentController(self)
        self._store_problem: str | None = None
        self.failed_load: BaseException | None = None  # the last load's error, while no engine is in
        self._queued = False  # a message sent while the model loads waits for it

    def get_driver_class(self):
        """In a browser tab (`parley web`), a driver that ends the app when its tab goes."""
        from textual.drivers.web_driver import WebDriver

        driver = super().get_driver_class()
        if driver is WebDriver:
            from parley.app.web import TabDriver

            return TabDriver
        return driver

    # layout
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="chat-column"):
                yield ChatView(id="chat")
                with Vertical(id="composer"):
                    yield PromptInput(id="prompt")
            yield ParamsPanel(self.params, id="params")
        yield StatusBar(id="status")
        yield Footer(compact=True)

    # The chat screen's widgets, found there even while a dialog or the progress screen is on top.
    @property
    def chat(self) -> ChatView:
        return self.screen_stack[0].query_one("#chat", ChatView)

    @property
    def prompt(self) -> PromptInput:
        return self.screen_stack[0].query_one("#prompt", PromptInput)

    @property
    def status(self) -> StatusBar:
        return self.screen_stack[0].query_one("#status", StatusBar)

    @property
    def panel(self) -> ParamsPanel:
        return self.screen_stack[0].query_one("#params", ParamsPanel)

    @property
    def attachment(self) -> Attachment | None:
        found = self.screen_stack[0].query("#attachment")
        return found.first(Attachment) if found else None

    @property
    def system_prompt(self) -> str:
        return self.conversation.system_prompt if self.conversation else self._system_prompt_draft

    def on_mount(self) -> None:
        saved_theme = self.settings.get("theme")
        if isinstance(saved_theme, str) and saved_theme in self.available_themes:
            self.theme = saved_theme
        self.theme_changed_signal.subscribe(self, self._remember_theme)
        if self.settings.get("show_drafts"):
            self.chat.add_class("-show-drafts")
        if self.settings.problem:
            self.notify(self.settings.problem, severity="warning", timeout=10, markup=False)
        self.replies.mount()
        self.set_interval(0.5, self._check_store)
        self.prompt.focus()
        self.load_engine()

    def on_unmount(self) -> None:
        self.replies.cancel_now()

    def _remember_theme(self, theme: Theme) -> None:
        self.settings.set("theme", theme.name)

    def _check_store(self) -> None:
        """Say once where the database is and what is wrong when the store starts to degrade."""
        problem = getattr(self.store, "problem", None)
        if problem and problem != self._store_problem:
            self.notify(problem, severity="warning", timeout=15, markup=False)
        self._store_problem = problem

    def watch_generating(self, generating: bool) -> None:
        self.status.generating = generating
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":
            return self.generating
        if self.engine is not None:
            return True
        # Loading: quitting and help; and the settings and history while the chat screen shows.
        allowed = ("help", "quit", "help_quit", "command_palette")
        if self.engines.loading is None:
            allowed += ("toggle_params", "reset_params", "toggle_drafts", "history", "speculation")
        return action in allowed

    # typing anywhere on the chat screen goes to the prompt
    async def on_event(self, event: events.Event) -> None:
        """A character typed while the focus is on a message, the conversation or a button moves the focus
        to the prompt before the key is routed: decided here, in arrival order, so a burst stays in order."""
        if (isinstance(event, events.Key) and event.is_printable and event.character
                and self.screen is self.screen_stack[0] and self.focused is not None
                and self.focused is not self.prompt
                and not isinstance(self.focused, Input | TextArea | Select)
                and event.key not in self.active_bindings):
            self.screen.set_focus(self.prompt)
        await super().on_event(event)

    def on_key(self, event: events.Key) -> None:
        """Esc that no widget used (the focus is on a message, say) goes back to the prompt."""
        if event.key == "escape" and self.screen is self.screen_stack[0] and self.focused is not self.prompt:
            event.stop()
            self.screen.set_focus(self.prompt)

    # engines
    def load_engine(self) -> Worker[None]:
        """Load the engine (again, on the loading screen's retry)."""
        return self.engines.load()

    def engine_loaded(self) -> None:
        """The first engine is in: back to the prompt, and measure what waited for it."""
        self.prompt.focus()
        chip = self.attachment
        if chip is not None and chip.tokens is None:
            self.attachments.count(chip.text)
        if self.conversation is not None:
            self._count_context()
        if self._queued:
            self._queued = False
            self.call_later(self._start_reply)

    def drop_session(self) -> None:
        """The next reply starts a new session (a new engine reads the conversation afresh)."""
        self._session = None

    def reply_finished(self) -> None:
        """Called by the reply controller once a reply has ended and been saved."""
        self.engines.switch_pending()

    # conversation
    def _ensure_conversation(self, first_text: str) -> Conversation:
        if self.conversation is None:
            title = (first_text.strip().splitlines() or ["Pasted document"])[0][:48]
            self.conversation = self.store.create_conversation(title, self._system_prompt_draft)
            self.sub_title = self.conversation.title
            overrides = self._overrides()
            if overrides:  # values changed before the first message belong to this conversation too
                self._save_overrides(overrides)
        return self.conversation

    def _ensure_session(self) -> SessionLike:
        assert self.engine is not None
        if self._session is None:
            self._session = self.engine.session(self.system_prompt or None)
        return self._session

    def conversation_texts(self) -> list[str]:
        return [compose_user_content(m.content, m.attachment) for m in self.chat.messages]

    def engine_messages(self) -> list[dict[str, str]]:
        """The visible conversation as the engine wants it: what is on screen is what the model saw."""
        return [{"role": m.role, "content": compose_user_content(without_marks(m.content), m.attachment)}
                for m in self.chat.messages]

    async def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        await self.send(event.text)

    async def send(self, text: str) -> None:
        text = text.strip()
        chip = self.attachment
        if self.engine is None and self._queued:
            self.notify("One message already waits for the model", severity="warning")
            return
        if self.generating:
            self.notify("A reply is streaming: Esc stops it", severity="warning")
            return
        if chip is not None and chip.tokens is None and self.engine is not None:
            self.notify("Still measuring the pasted document", severity="warning")
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
        if self.engine is None:  # answered as soon as the model is in
            self._queued = True
            self.notify("Queued: answered once the model has loaded")
            return
        await self._start_reply()

    async def _start_reply(self) -> None:
        documents = {i: m.attachment_name or "you pasted" for i, m in enumerate(self.chat.messages)
                     if m.attachment is not None}
        await self.replies.start(self._ensure_session(), self.engine_messages(), self.params, documents)

    async def _take_back_last_user_message(self) -> None:
        """Remove the last user message (and what follows) and put it back in the composer."""
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

    # actions
    async def action_stop(self) -> None:
        await self.replies.stop()
        self.prompt.focus()

    async def action_quit(self) -> None:
        """Quit; a reply in flight is saved as it stands, marked as interrupted."""
        await self.replies.interrupt()
        # After a failed load, the exit status says so (scripts and service managers read it).
        self.exit(return_code=1 if self.engine is None and self.failed_load is not None else 0)

    async def action_help_quit(self) -> None:
        """Ctrl+C (Textual's own binding, reached when no text is selected to copy) quits, as in a terminal."""
        await self.action_quit()

    async def action_regenerate(self) -> None:
        if self.generating or self.engine is None:
            return
        messages = self.chat.messages
        if messages and messages[-1].role == "assistant":
            if messages[-1].db_id is not None:
                self.store.delete_message(messages[-1].db_id)
            await messages[-1].remove()
            messages = messages[:-1]
        if messages and messages[-1].role == "user":
            await self._start_reply()
        else:
            self.notify("Nothing to regenerate yet")

    async def action_edit_last(self) -> None:
        if self.generating:
            self.notify("Esc stops the reply first", severity="warning")
            return
        await self._take_back_last_user_message()

    async def on_prompt_input_edit_last(self, event: PromptInput.EditLast) -> None:
        await self.action_edit_last()

    async def action_new_chat(self) -> None:
        await self.replies.stop()
        await self.chat.remove_children()
        self.conversation = None
        self._session = None
        self._queued = False
        self.status.context_used = 0
        self._system_prompt_draft = str(self.settings.get("system_prompt", "") or "")
        self.status.stats = None
        self.sub_title = ""
        self._load_params(self._global_params)
        await self.attachments.remove()
        self.prompt.clear()
        self.prompt.focus()

    async def resume(self, conversation_id: int) -> None:
        conversation = self.store.conversation(conversation_id)
        if conversation is None:
            return
        await self.action_new_chat()
        self.conversation = conversation
        self.sub_title = conversation.title
        self._load_params({**self._global_params, **self._overrides()})
        views = []
        for m in self.store.messages(conversation_id):
            view = ChatMessage(m.role, m.content, m.attachment)
            view.db_id = m.id
            views.append(view)
        await self.chat.mount_all(views)
        self.chat.anchor()
        self._count_context()

    @work(thread=True, group="count-context", exclusive=True, exit_on_error=False)
    def _count_context(self) -> None:
        """The tokens a resumed conversation will take in the context (the status bar's `ctx`)."""
        engine, texts = self.engine, self.conversation_texts()
        if engine is None:
            return
        used = paste_budget.budget(engine.context_window, sum(engine.count_tokens(t) for t in texts),
                                   max(0, len(texts) - 2), 0).used
        self.call_from_thread(setattr, self.status, "context_used", used)

    # settings
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

    def on_params_panel_changed(self, event: ParamsPanel.Changed) -> None:
        """Keep the value: for the next start, and for this conversation when it is resumed."""
        if event.attr == "seed":
            return
        self._global_params[event.attr] = event.value
        self.settings.save_params_values(self._global_params)
        if self.conversation is not None:
            self._save_overrides({**self._overrides(), event.attr: event.value})

    def action_reset_params(self) -> None:
        defaults = GenerationParams()
        values = {name: getattr(defaults, name, REPETITION_DEFAULTS.get(name)) for name in self._global_params}
        self._global_params = dict(values)
        self.settings.save_params_values(values)
        if self.conversation is not None:
            self._save_overrides({})
        self._load_params(values)
        self.notify("Sampling settings reset to defaults")

    def action_toggle_drafts(self) -> None:
        self.chat.toggle_class("-show-drafts")
        on = self.chat.has_class("-show-drafts")
        self.settings.set("show_drafts", on)
        if on:
            for m in self.chat.messages:
                m.show_drafts()
        self.notify("Drafted tokens are highlighted" if on else "Drafted tokens: colouring off")

    def action_pick_model(self) -> None:
        if self.engines.load_model is None:
            self.notify("Switching models works with the local engine, not with --server", severity="warning")
            return
        from parley.app.screens.model_picker import ModelPickerScreen, cached_models

        recent = self.settings.get(RECENT_KEY, [])
        screen = ModelPickerScreen(self.status.model, [r for r in recent if isinstance(r, str)]
                                   if isinstance(recent, list) else [], cached_models())

        def chosen(ref: str | None) -> None:
            if ref:
                self.engines.switch_model(ref)

        self.push_screen(screen, chosen)

    def model_switched(self, ref: str) -> None:
        """A model picked in the picker is loaded: remembered as used lately."""
        self.model_ref = ref
        self.settings.set(RECENT_KEY, remember(self.settings.get(RECENT_KEY, []), ref))

    def action_speculation(self) -> None:
        """Open the sampling panel on the speculation choice, where each choice is explained."""
        main = self.screen_stack[0].query_one("#main")
        main.add_class("-params")
        select = self.panel.query_one("#speculation", Select)
        self.screen.set_focus(select)
        self.panel.scroll_to_widget(select)

    def action_toggle_params(self) -> None:
        main = self.screen_stack[0].query_one("#main")
        main.toggle_class("-params")
        # Focus now (not after a refresh, as focus() does), so the keys typed right after F2 go to the slider.
        if main.has_class("-params"):
            self.screen.set_focus(self.panel.query(Slider).first())
        else:
            self.screen.set_focus(self.prompt)

    def action_help(self) -> None:
        self.push_screen(HelpScreen([
            ("Chat", Binding.make_bindings(self.BINDINGS)),
            ("Prompt", Binding.make_bindings(PromptInput.BINDINGS)),
            ("On a message (Tab)", Binding.make_bindings(ChatMessage.BINDINGS)),
        ]))

    def action_history(self) -> None:
        async def chosen(conversation_id: int | None) -> None:
            if conversation_id is not None:
                await self.resume(conversation_id)

        self.push_screen(HistoryScreen(self.store, self.conversation.id if self.conversation else None), chosen)

    def on_renamed(self, event: Renamed) -> None:
        if self.conversation and self.conversation.id == event.conversation_id:
            self.conversation = self.store.conversation(event.conversation_id)
            self.sub_title = event.title

    async def on_deleted(self, event: Deleted) -> None:
        if self.conversation and self.conversation.id == event.conversation_id:
            await self.action_new_chat()

    def action_system_prompt(self) -> None:
        screen = SystemPromptScreen(self.system_prompt)

        def saved(text: str | None) -> None:
            if text is None:
                return
            if self.conversation is not None:
                self.store.set_system_prompt(self.conversation.id, text)
                self.conversation = self.store.conversation(self.conversation.id)
            else:
                self._system_prompt_draft = text
            if screen.as_default:
                self.settings.set("system_prompt", text)  # new conversations start with it
            self._session = None  # the next reply starts a session with the new system prompt
            where = " and for new chats" if screen.as_default else ""
            self.notify(f"System prompt saved for this chat{where}: it applies from the next reply")

        self.push_screen(screen, saved)

    def action_export(self) -> None:
        if self.conversation is None:
            self.notify("Nothing to export yet", severity="warning")
            return
        self.export_conversation(self.conversation.id)

    def export_conversation(self, conversation_id: int) -> Path | None:
        conversation = self.store.conversation(conversation_id)
        if conversation is None:
            return None
        path = (self.export_dir / f"{slug(conversation.title)}-{conversation_id}.md").resolve()
        try:
            path.write_text(self.store.export_markdown(conversation_id), encoding="utf-8")
        except OSError as e:
            self.notify(f"Could not export to {path}: {e.strerror or e}", severity="error", markup=False)
            return None
        self.notify(f"Exported to {path}", title="Export", timeout=10, markup=False)
        return path

    def _last_reply(self) -> ChatMessage | None:
        replies = [m for m in self.chat.messages if m.role == "assistant"]
        return replies[-1] if replies else None

    def action_copy_reply(self) -> None:
        if (reply := self._last_reply()) is not None:
            reply.action_copy_message()

    def action_copy_code(self) -> None:
        if (reply := self._last_reply()) is not None:
            reply.action_copy_code()

    # pasted and opened documents
    def action_open_file(self) -> None:
        self.attachments.open_file()

    async def attach_file(self, path: Path) -> None:
        """Attach a text file as the document sent with the next message (llama-cli's /read)."""
        await self.attachments.attach_file(path)

    async def on_prompt_input_large_paste(self, event: PromptInput.LargePaste) -> None:
        await self.attachments.attach_text(event.text)

    async def on_prompt_input_summarise(self, event: PromptInput.Summarise) -> None:
        await self.action_summarise()

    async def action_summarise(self) -> None:
        await self.attachments.summarise()

    async def on_attachment_removed(self, event: Attachment.Removed) -> None:
        await self.attachments.dismiss()
