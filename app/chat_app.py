"""The Parley chat app: the shell that makes the parts and connects them.

`ParleyApp` makes the controllers (engines: engine_lifecycle.py; the reply in flight: reply_controller.py; the
conversation: conversation.py; documents: attachments.py) and the `ChatScreen` (screens/chat.py) that mounts
them on its widgets, holds the chat's keys and routes its messages. The app keeps what is app-wide: the theme,
the store's health, quitting, and the messages from the dialogs it shows. Engine work runs on background
threads; the UI thread never waits on the model.
"""

from __future__ import annotations

from pathlib import Path

from textual import events
from textual.app import App
from textual.binding import Binding
from textual.screen import Screen
from textual.theme import Theme
from textual.widgets import Input, Select, TextArea

from parley.app.attachments import AttachmentController
from parley.app.commands import ParleyCommands
from parley.app.conversation import ConversationController
from parley.app.engine_lifecycle import EngineLifecycle, EngineLoader, EngineUpgrade, ModelLoader
from parley.app.first_run import QuantizeInBackground
from parley.app.reply_controller import ReplyController
from parley.app.screens.chat import ChatScreen
from parley.app.screens.help import HelpScreen
from parley.app.screens.history import Deleted, ExportAsked, Renamed
from parley.app.screens.loading import LoadingScreen
from parley.app.settings import Settings
from parley.app.store import Conversation, Store, data_dir
from parley.app.widgets.attachment import Attachment
from parley.app.widgets.message import ChatMessage, ChatView
from parley.app.widgets.params_panel import ParamsPanel
from parley.app.widgets.prompt import PromptInput
from parley.app.widgets.status_bar import StatusBar
from parley.engine.params import GenerationParams
from parley.engine.protocol import EngineLike


class ParleyApp(App[int]):
    """A terminal chat over an engine. The engine comes from `load_engine(progress)`."""

    CSS_PATH = Path(__file__).parent / "parley.tcss"  # absolute, so subclasses elsewhere keep it
    TITLE = "Parley"
    COMMANDS = App.COMMANDS | {ParleyCommands}
    # The keys that work on every screen (the chat's own are on `ChatScreen`); the tooltip is the command
    # palette's title and the help screen's line.
    BINDINGS = [Binding("f1", "help", "Help", tooltip="Show all keys")]

    def __init__(self, load_engine: EngineLoader, *, upgrade_engine: EngineUpgrade | None = None,
                 load_model: ModelLoader | None = None, model_ref: str | None = None, store: Store | None = None,
                 settings: Settings | None = None, params: GenerationParams | None = None,
                 system_prompt: str | None = None, export_dir: Path | None = None,
                 batch_interval: float = 0.04, first_run: QuantizeInBackground | None = None,
                 chosen_params: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.store = store if store is not None else Store()
        self.settings = settings if settings is not None else Settings()
        self.params = params if params is not None else self.settings.params()
        self.replies = ReplyController(self.store, batch_interval)
        self.engines = EngineLifecycle(load_engine, upgrade_engine, load_model, settings=self.settings,
                                       model_ref=model_ref, busy=lambda: self.replies.busy, first_run=first_run)
        self.attachments = AttachmentController(self.engines, self.params)
        exports = Path(export_dir) if export_dir is not None else data_dir() / "exports"  # not the current dir
        self.conversations = ConversationController(
            self.store, self.settings, self.params, exports,
            system_prompt, engines=self.engines, replies=self.replies, attachments=self.attachments,
            chosen_params=chosen_params)
        self.chat_screen = ChatScreen(self.params, self.store, self.settings, engines=self.engines,
                                      replies=self.replies, conversations=self.conversations,
                                      attachments=self.attachments)
        self._store_problem: str | None = None

    def get_default_screen(self) -> Screen:
        return self.chat_screen

    def get_driver_class(self):
        """In a browser tab (`parley web`), a driver that ends the app when its tab goes."""
        from textual.drivers.web_driver import WebDriver

        driver = super().get_driver_class()
        if driver is WebDriver:
            from parley.app.server.tab_driver import TabDriver

            return TabDriver
        return driver

    # The state the parts own, read in one place (tests and the exit status read it here).
    @property
    def engine(self) -> EngineLike | None:
        return self.engines.engine

    @property
    def generating(self) -> bool:
        return self.replies.busy

    @property
    def model_ref(self) -> str | None:
        return self.engines.model_ref

    @property
    def conversation(self) -> Conversation | None:
        return self.conversations.conversation

    @property
    def system_prompt(self) -> str:
        return self.conversations.system_prompt

    # The chat screen's widgets, found there even while a dialog or the progress screen is on top.
    @property
    def chat(self) -> ChatView:
        return self.chat_screen.query_one(ChatView)

    @property
    def prompt(self) -> PromptInput:
        return self.chat_screen.query_one(PromptInput)

    @property
    def status(self) -> StatusBar:
        return self.chat_screen.query_one(StatusBar)

    @property
    def panel(self) -> ParamsPanel:
        return self.chat_screen.query_one(ParamsPanel)

    @property
    def attachment(self) -> Attachment | None:
        return self.attachments.chip

    def on_mount(self) -> None:
        saved_theme = self.settings.get("theme")
        if isinstance(saved_theme, str) and saved_theme in self.available_themes:
            self.theme = saved_theme
        self.theme_changed_signal.subscribe(self, self._remember_theme)
        if self.settings.problem:
            self.notify(self.settings.problem, severity="warning", timeout=10, markup=False)
        self.set_interval(0.5, self._check_store)

    def _remember_theme(self, theme: Theme) -> None:
        self.settings.set("theme", theme.name)

    def _check_store(self) -> None:
        """Say once where the database is and what is wrong when the store starts to degrade."""
        problem = getattr(self.store, "problem", None)
        if problem and problem != self._store_problem:
            self.notify(problem, severity="warning", timeout=15, markup=False)
        self._store_problem = problem

    async def on_event(self, event: events.Event) -> None:
        """A character typed while the focus is on a message, the conversation or a button moves the focus
        to the prompt before the key is routed (keys go straight to the focused widget, so this is decided
        here, in arrival order, and a burst stays in order)."""
        if (isinstance(event, events.Key) and event.is_printable and event.character
                and self.screen is self.chat_screen and self.focused is not None
                and self.focused is not self.prompt
                and not isinstance(self.focused, Input | TextArea | Select)
                and event.key not in self.active_bindings):
            self.screen.set_focus(self.prompt)
        await super().on_event(event)

    def action_help(self) -> None:
        self.push_screen(HelpScreen([
            ("Chat", Binding.make_bindings([*ChatScreen.BINDINGS, *self.BINDINGS])),
            ("Prompt", Binding.make_bindings(PromptInput.BINDINGS)),
            ("On a message (Tab)", Binding.make_bindings(ChatMessage.BINDINGS)),
        ]))

    async def action_quit(self) -> None:
        """Quit; a reply in flight is saved as it stands, marked as interrupted."""
        await self.replies.interrupt()
        # After a failed load, the exit status says so (scripts and service managers read it).
        self.exit(return_code=1 if self.engine is None and self.engines.failed_load is not None else 0)

    async def action_help_quit(self) -> None:
        """Ctrl+C (Textual's own binding, reached when no text is selected to copy) quits, as in a terminal."""
        await self.action_quit()

    # what the dialogs say
    def on_renamed(self, event: Renamed) -> None:
        self.conversations.renamed(event.conversation_id, event.title)

    async def on_deleted(self, event: Deleted) -> None:
        await self.conversations.deleted(event.conversation_id)

    def on_export_asked(self, event: ExportAsked) -> None:
        self.conversations.export(event.conversation_id)

    def on_loading_screen_retry(self, event: LoadingScreen.Retry) -> None:
        self.engines.load()
