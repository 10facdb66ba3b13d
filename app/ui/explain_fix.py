"""The Fix card of an image's explanation: the fix in the terms of the tool that made the image,
ready to copy, and for a ComfyUI user the image's workflow with HalfSafe Fix to save and
HalfSafe's nodes to install."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QPushButton

from app.core.errors import HalfSafeError
from app.core.explain.node_fix import NodeFix
from app.core.words.nodes import NODE_WORDS
from app.core.words.tools import ToolFix
from app.ui import folders
from app.ui.dialogs import Dialogs
from app.ui.explain_words import fix_words, node_fix_lines
from app.ui.widgets import Card, label


class FixCard(Card):
    """The fix for the image at `path`, hidden until `show_fix`. `node_fix` is the latest
    explanation's workflow with HalfSafe Fix (None where the image has none); a file that cannot
    be written or a folder that is no ComfyUI is one sentence to `dialogs`."""

    def __init__(self, path: str, dialogs: Dialogs) -> None:
        super().__init__("Fix")
        self.path = path
        self.dialogs = dialogs
        self.node_fix: NodeFix | None = None
        self.fix_text = ""
        self.fix_body = label("", wrap=True, selectable=True)
        self.fix_body.setTextFormat(Qt.TextFormat.RichText)
        self.body.addWidget(self.fix_body)
        self.copy_button = QPushButton("Copy the fix")
        self.copy_button.clicked.connect(self.copy_fix)
        # For a ComfyUI user: the image's workflow with HalfSafe Fix, and the nodes themselves.
        self.save_workflow_button = QPushButton("Save workflow…")
        self.save_workflow_button.setToolTip(
            "Save the image's workflow with HalfSafe Check and HalfSafe Fix placed after its "
            "model loader, to drop into ComfyUI."
        )
        self.save_workflow_button.clicked.connect(self.save_workflow)
        self.install_nodes_button = QPushButton("Install HalfSafe's nodes…")
        self.install_nodes_button.setToolTip(
            "Copy HalfSafe's node package into your ComfyUI's custom_nodes folder."
        )
        self.install_nodes_button.clicked.connect(self.install_nodes)
        fix_buttons = QHBoxLayout()
        for button in (self.copy_button, self.save_workflow_button, self.install_nodes_button):
            fix_buttons.addWidget(button)
        fix_buttons.addStretch(1)
        self.body.addLayout(fix_buttons)
        self.installed_text = label("", "muted", wrap=True, selectable=True)
        self.installed_text.hide()
        self.body.addWidget(self.installed_text)
        self.hide()

    def show_fix(self, for_tool: ToolFix, halfsafe_flags: list[str]) -> None:
        """Show the fix in `for_tool`'s terms (with HalfSafe's own flags beside another tool's),
        and for a ComfyUI image HalfSafe Fix first, the flags as its fallback."""
        title, text, self.fix_text = fix_words(for_tool, halfsafe_flags)
        self.title.setText(title)
        self.fix_body.setText(text)
        self.show()
        node_fix = self.node_fix
        self.save_workflow_button.setVisible(node_fix is not None)
        self.install_nodes_button.setVisible(node_fix is not None)
        if node_fix is not None:
            self.fix_body.setText("<br>".join([*node_fix_lines(node_fix), self.fix_body.text()]))

    def copy_fix(self) -> None:
        QGuiApplication.clipboard().setText(self.fix_text)

    def save_workflow(self) -> None:
        if self.node_fix is None:
            return
        suggested = str(Path(self.path).with_name(self.node_fix.file_name))
        path, _ = QFileDialog.getSaveFileName(
            self.window(), "Save workflow", suggested, "ComfyUI workflow (*.json)"
        )
        if path:
            self.save_workflow_to(path)

    def save_workflow_to(self, path: str) -> None:
        """Write the workflow with HalfSafe Fix to `path`; a failure is one sentence."""
        if self.node_fix is None:
            return
        try:
            self.node_fix.save(path)
        except HalfSafeError as error:
            self.dialogs.error(str(error))
            return
        self._said(NODE_WORDS["saved"].format(path=path))

    def install_nodes(self) -> None:
        """Copy HalfSafe's nodes into the ComfyUI HalfSafe found; where it found none or
        several, say so and let the user name the folder."""
        from app.core.comfyui.install import found_comfyuis, where_to_install

        try:
            root = where_to_install(None)
        except HalfSafeError as error:
            self._said(str(error))
            found = found_comfyuis()
            start = str(found[0]) if found else folders.models()
            chosen = QFileDialog.getExistingDirectory(self.window(), "Your ComfyUI folder", start)
            if chosen:
                self.install_nodes_into(chosen)
            return
        self.install_nodes_into(str(root))

    def install_nodes_into(self, folder: str) -> None:
        """Copy HalfSafe's nodes into the ComfyUI at `folder` and say what the user must then
        do; a folder that is not one is one sentence."""
        from app.core.comfyui.install import install_nodes

        try:
            installed = install_nodes(folder)
        except HalfSafeError as error:
            self.dialogs.error(str(error))
            return
        self._said(installed.words)

    def _said(self, text: str) -> None:
        self.installed_text.setText(text)
        self.installed_text.show()
