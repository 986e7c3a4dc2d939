"""The chat screen: conversation, composer, sampling panel and status bar, and the keys that act on them.

The screen owns the chat's bindings (shown in its footer, listed in the command palette and the help screen)
and hands each key, and each message its widgets and controllers post, to the controller that owns it. The
controllers are made by the app and mounted here on the widgets they draw on.
"""

from __future__ import annotations

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header

from parley.app.attachments import AttachmentController
from parley.app.conversation import ConversationController, Titled
from parley.app.engine_lifecycle import EngineLifecycle, EngineReady, ModelDefaults
from parley.app.reply_controller import ReplyController, ReplyFinished, ReplyStarted
from parley.app.screens.history import HistoryScreen
from parley.app.settings import Settings
from parley.app.store import Store
from parley.app.widgets.attachment import Attachment
from parley.app.widgets.message import ChatView
from parley.app.widgets.params_panel import ParamsPanel
from parley.app.widgets.prompt import PromptInput
from parley.app.widgets.slider import Slider
from parley.app.widgets.status_bar import StatusBar
from parley.engine.params import GenerationParams


class ChatScreen(Screen[None]):
    """The app's first screen; the dialogs, the help and the loading progress go on top of it."""

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
        Binding("ctrl+f", "details", "Figures", show=False,
                tooltip="The status bar in full: every figure, what fills the context, background work"),
        Binding("f12", "speculation", "Speculation", show=False,
                tooltip="Speculation: how replies are sped up, explained (sampling panel)"),
    ]

    def __init__(self, params: GenerationParams, store: Store, settings: Settings, *, engines: EngineLifecycle,
                 replies: ReplyController, conversations: ConversationController,
                 attachments: AttachmentController) -> None:
        super().__init__()
        self.params, self.store, self.settings = params, store, settings
        self.engines, self.replies = engines, replies
        self.conversations, self.attachments = conversations, attachments

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

    def on_mount(self) -> None:
        chat, prompt = self.query_one(ChatView), self.query_one(PromptInput)
        status, panel = self.query_one(StatusBar), self.query_one(ParamsPanel)
        if self.settings.get("show_drafts"):
            chat.add_class("-show-drafts")
        self.replies.mount(self, chat, status, panel)
        self.attachments.mount(self, chat, self.query_one("#composer"), prompt)
        self.conversations.mount(self, chat, prompt, status, panel)
        prompt.focus()
        self.engines.mount(self, status, panel)

    def on_unmount(self) -> None:
        self.replies.cancel_now()
        self.engines.close()

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action not in CHAT_ACTIONS:  # Textual's own (focus, copying a selection)
            return super().check_action(action, parameters)
        if action == "stop":
            return self.replies.busy
        if self.engines.engine is not None:
            return True
        # Loading: the settings and history while the chat screen shows (help and quitting are the app's).
        return self.engines.loading is None and action in (
            "toggle_params", "reset_params", "toggle_drafts", "history", "speculation", "details")

    def on_key(self, event: events.Key) -> None:
        """Esc that no widget used (the focus is on a message, a slider) goes back to the prompt; while a
        reply streams it also stops it, as everywhere else (the Stop binding does both)."""
        if event.key == "escape" and self.focused is not self.prompt and not self.replies.busy:
            event.stop()
            self.set_focus(self.prompt)

    # what the controllers say
    @on(EngineReady)
    def _engine_ready(self) -> None:
        self.prompt.focus()
        self.attachments.count_waiting()
        self.conversations.engine_ready()

    @on(ModelDefaults)
    def _model_defaults(self, message: ModelDefaults) -> None:
        self.conversations.model_defaults(message.values, message.source)

    @on(Titled)
    def _titled(self, message: Titled) -> None:
        self.app.sub_title = message.title

    @on(ReplyStarted)
    @on(ReplyFinished)
    def _reply_state(self, message: ReplyStarted | ReplyFinished) -> None:
        self.query_one(StatusBar).generating = self.replies.busy  # the controller's word, whatever the order
        self.refresh_bindings()
        if isinstance(message, ReplyFinished):
            self.engines.switch_pending()

    # the keys, each handed to its owner
    async def action_stop(self) -> None:
        await self.replies.stop()
        self.prompt.focus()

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

    def action_pick_model(self) -> None:
        self.engines.pick_model()

    def action_details(self) -> None:
        status = self.query_one(StatusBar)
        status.expanded = not status.expanded

    def action_toggle_drafts(self) -> None:
        on = self.query_one(ChatView).toggle_drafts()
        self.settings.set("show_drafts", on)
        self.notify("Drafted tokens are highlighted" if on else "Drafted tokens: colouring off")

    def action_toggle_params(self, focus: str | None = None) -> None:
        main, panel = self.query_one("#main"), self.query_one(ParamsPanel)
        main.set_class(focus is not None or not main.has_class("-params"), "-params")
        # Focus now (not after a refresh, as focus() does), so the keys typed right after F2 go to the slider.
        if main.has_class("-params"):
            target = panel.query_one(focus) if focus else panel.query(Slider).first()
            self.set_focus(target)
            panel.scroll_to_widget(target)
        else:
            self.set_focus(self.prompt)

    def action_speculation(self) -> None:
        """The sampling panel, on the speculation choice (each choice is explained there)."""
        self.action_toggle_params("#speculation")

    def action_history(self) -> None:
        async def chosen(conversation_id: int | None) -> None:
            if conversation_id is not None:
                await self.conversations.resume(conversation_id)

        conversation = self.conversations.conversation
        self.app.push_screen(HistoryScreen(self.store, conversation.id if conversation else None), chosen)

    # what the widgets say
    async def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        await self.conversations.send(event.text)

    async def on_prompt_input_edit_last(self, event: PromptInput.EditLast) -> None:
        await self.conversations.edit_last()

    async def on_prompt_input_large_paste(self, event: PromptInput.LargePaste) -> None:
        await self.attachments.attach_text(event.text)

    def on_prompt_input_summarise(self, event: PromptInput.Summarise) -> None:
        self.attachments.summarise()

    async def on_attachment_removed(self, event: Attachment.Removed) -> None:
        await self.attachments.dismiss()

    def on_params_panel_changed(self, event: ParamsPanel.Changed) -> None:
        self.conversations.param_changed(event.attr, event.value)


CHAT_ACTIONS = {b.action.partition("(")[0] for b in Binding.make_bindings(ChatScreen.BINDINGS)}
