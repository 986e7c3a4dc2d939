"""The Parley chat app: conversation, composer, live sampling panel, status bar.

`ParleyApp` is the shell: it composes the screen, holds the keys that work anywhere on it, and hands each one
off. Loading and switching engines live in `EngineLifecycle` (engine_lifecycle.py), a reply's lifecycle in
`ReplyController` (reply_controller.py), the conversation (its turns, history, system prompt, exports and
sampling values) in `ConversationController` (conversation.py), pasted and opened documents in
`AttachmentController` (attachments.py). Engine work runs on background threads; the UI thread never waits on
the model.
"""

from __future__ import annotations

from pathlib import Path

from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.theme import Theme
from textual.widgets import Footer, Header, Input, Select, TextArea

from parley.app.attachments import AttachmentController
from parley.app.commands import ParleyCommands
from parley.app.conversation import ConversationController
from parley.app.engine_lifecycle import EngineLifecycle, EngineLoader, EngineUpgrade, ModelLoader
from parley.app.reply_controller import ReplyController
from parley.app.screens.help import HelpScreen
from parley.app.screens.history import Deleted, HistoryScreen, Renamed
from parley.app.settings import Settings
from parley.app.store import Conversation, Store
from parley.app.widgets.attachment import Attachment
from parley.app.widgets.message import ChatMessage, ChatView
from parley.app.widgets.params_panel import ParamsPanel
from parley.app.widgets.prompt import PromptInput
from parley.app.widgets.slider import Slider
from parley.app.widgets.status_bar import StatusBar
from parley.engine.params import GenerationParams
from parley.engine.protocol import EngineLike


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
        Binding("ctrl+l", "copy_reply(True)", "Copy code", show=False,
                tooltip="Copy the last code block of the last reply"),
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

    def __init__(self, load_engine: EngineLoader, *, upgrade_engine: EngineUpgrade | None = None,
                 load_model: ModelLoader | None = None, model_ref: str | None = None, store: Store | None = None,
                 settings: Settings | None = None, params: GenerationParams | None = None,
                 system_prompt: str | None = None, export_dir: Path | None = None,
                 batch_interval: float = 0.04) -> None:
        super().__init__()
        self.model_ref = model_ref
        self.store = store if store is not None else Store()
        self.settings = settings if settings is not None else Settings()
        self.params = params if params is not None else self.settings.params()
        self.export_dir = Path(export_dir) if export_dir is not None else Path.cwd()
        self.engine: EngineLike | None = None  # set by `engines`, read by everyone
        self.failed_load: BaseException | None = None  # the last load's error, while no engine is in
        self.engines = EngineLifecycle(self, load_engine, upgrade_engine, load_model)
        self.replies = ReplyController(self, batch_interval)
        self.conversations = ConversationController(self, system_prompt)
        self.attachments = AttachmentController(self)
        self._store_problem: str | None = None

    def get_driver_class(self):
        """In a browser tab (`parley web`), a driver that ends the app when its tab goes."""
        from textual.drivers.web_driver import WebDriver

        driver = super().get_driver_class()
        if driver is WebDriver:
            from parley.app.server.web import TabDriver

            return TabDriver
        return driver

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
    def conversation(self) -> Conversation | None:
        return self.conversations.conversation

    @property
    def system_prompt(self) -> str:
        return self.conversations.system_prompt

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
        self.engines.load()

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

    # what the controllers tell the shell
    def engine_loaded(self) -> None:
        """The first engine is in: back to the prompt, and measure what waited for it."""
        self.prompt.focus()
        chip = self.attachment
        if chip is not None and chip.tokens is None:
            self.attachments.count(chip.text)
        self.conversations.engine_ready()

    def drop_session(self) -> None:
        """The next reply starts a new session (a new engine reads the conversation afresh)."""
        self.conversations.session = None

    def reply_finished(self) -> None:
        self.engines.switch_pending()

    # the keys, each handed to its owner
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

    async def action_new_chat(self) -> None:
        await self.conversations.new_chat()

    async def action_regenerate(self) -> None:
        await self.conversations.regenerate()

    async def action_edit_last(self) -> None:
        await self.conversations.edit_last()

    def action_system_prompt(self) -> None:
        self.conversations.edit_system_prompt()

    def action_reset_params(self) -> None:
        self.conversations.reset_params()

    def action_export(self) -> None:
        self.conversations.export()

    def action_copy_reply(self, code: bool = False) -> None:
        self.conversations.copy_last_reply(code)

    def action_open_file(self) -> None:
        self.attachments.open_file()

    async def action_summarise(self) -> None:
        await self.attachments.summarise()

    def action_pick_model(self) -> None:
        self.engines.pick_model()

    def action_toggle_drafts(self) -> None:
        on = self.chat.toggle_drafts()
        self.settings.set("show_drafts", on)
        self.notify("Drafted tokens are highlighted" if on else "Drafted tokens: colouring off")

    def action_toggle_params(self, focus: str | None = None) -> None:
        main = self.screen_stack[0].query_one("#main")
        main.set_class(focus is not None or not main.has_class("-params"), "-params")
        # Focus now (not after a refresh, as focus() does), so the keys typed right after F2 go to the slider.
        if main.has_class("-params"):
            target = self.panel.query_one(focus) if focus else self.panel.query(Slider).first()
            self.screen.set_focus(target)
            self.panel.scroll_to_widget(target)
        else:
            self.screen.set_focus(self.prompt)

    def action_speculation(self) -> None:
        """The sampling panel, on the speculation choice (each choice is explained there)."""
        self.action_toggle_params("#speculation")

    def action_help(self) -> None:
        self.push_screen(HelpScreen([
            ("Chat", Binding.make_bindings(self.BINDINGS)),
            ("Prompt", Binding.make_bindings(PromptInput.BINDINGS)),
            ("On a message (Tab)", Binding.make_bindings(ChatMessage.BINDINGS)),
        ]))

    def action_history(self) -> None:
        async def chosen(conversation_id: int | None) -> None:
            if conversation_id is not None:
                await self.conversations.resume(conversation_id)

        self.push_screen(HistoryScreen(self.store, self.conversation.id if self.conversation else None), chosen)

    # what the widgets and screens say
    async def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        await self.conversations.send(event.text)

    async def on_prompt_input_edit_last(self, event: PromptInput.EditLast) -> None:
        await self.conversations.edit_last()

    async def on_prompt_input_large_paste(self, event: PromptInput.LargePaste) -> None:
        await self.attachments.attach_text(event.text)

    async def on_prompt_input_summarise(self, event: PromptInput.Summarise) -> None:
        await self.attachments.summarise()

    async def on_attachment_removed(self, event: Attachment.Removed) -> None:
        await self.attachments.dismiss()

    def on_params_panel_changed(self, event: ParamsPanel.Changed) -> None:
        self.conversations.param_changed(event.attr, event.value)

    def on_renamed(self, event: Renamed) -> None:
        self.conversations.renamed(event.conversation_id, event.title)

    async def on_deleted(self, event: Deleted) -> None:
        await self.conversations.deleted(event.conversation_id)
