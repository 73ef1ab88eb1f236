"""Sphinx settings of the course's website, built by ``python -m helpers.build`` from the executed lessons.

Everything the pages load ships with the installed packages (the themes bundle their scripts, styles and
fonts; formulas become MathML in the HTML itself), so the site works offline, opened from disk.
"""

import os

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

from helpers.site import course_repository

# The repository the Colab links, the clone line and the repository button point at; None shows none of them.
REPOSITORY = course_repository()
BRANCH = os.environ.get("COURSE_BRANCH", "main")
# Colab opens notebooks from GitHub only; another host gets the clone line and the repository button.
COLAB = REPOSITORY if REPOSITORY and REPOSITORY.startswith("https://github.com/") else None

project = "Distributed PyTorch, hands-on"
html_title = project
extensions = ["myst_nb", "sphinx_copybutton"]
exclude_patterns = [".doctrees", "**.ipynb_checkpoints", "_exercises"]  # downloads, not pages
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type"]

nb_execution_mode = "off"  # the pages show the outputs of the run that `make course` did, never a re-run
nb_ipywidgets_js = {}  # no widget scripts from a CDN
myst_enable_extensions = ["dollarmath"]
html_math_renderer = "mathml"  # see setup(): no MathJax, which Sphinx would fetch from a CDN

html_theme = "sphinx_book_theme"
html_theme_options = {
    "path_to_docs": "notebooks",
    "use_download_button": True,
    "show_toc_level": 2,
    # no footer: the theme's begins "By <author>", which Sphinx fills with "Author name not set"
    "footer_content_items": [],
}
if REPOSITORY:
    html_theme_options |= {"repository_url": REPOSITORY, "repository_branch": BRANCH, "use_repository_button": True}
if COLAB:
    html_theme_options["launch_buttons"] = {"colab_url": "https://colab.research.google.com"}
html_static_path = ["static"]
html_css_files = ["course.css"]
html_show_sphinx = False


class CourseLaunch(SphinxDirective):
    """``{course-launch}``: where to run the page's lesson, in Colab or in a local JupyterLab."""

    def run(self):
        notebook = f"notebooks/{self.env.docname}.ipynb"
        para = nodes.paragraph(classes=["course-launch"])
        para += nodes.strong(text="Run it: ")
        if COLAB:
            colab = f"https://colab.research.google.com/github/{COLAB.split('github.com/', 1)[1]}/blob/{BRANCH}/"
            para += nodes.reference("", "Open in Colab", refuri=colab + notebook)
            para += nodes.Text(" · ")
        if REPOSITORY:
            para += nodes.Text("Open in JupyterLab: ")
            para += nodes.literal(text=f"git clone {REPOSITORY} && cd {REPOSITORY.rsplit('/', 1)[1]} "
                                       f"&& make install && .venv/bin/jupyter lab {notebook}")
        else:
            para += nodes.Text("Open in JupyterLab, in the course's folder: ")
            para += nodes.literal(text=f"make install && .venv/bin/jupyter lab {notebook}")
        return [para]


def _mathml(self, node, display):
    """Write a formula as MathML, which browsers draw themselves; TeX the converter cannot read stays as code."""
    from html import escape

    from latex2mathml.converter import convert

    try:
        self.body.append(convert(node.astext(), display="block" if display else "inline"))
    except Exception:  # a formula it cannot parse shows as its source rather than failing the site
        self.body.append(f"<code>{escape(node.astext())}</code>")
    raise nodes.SkipNode


def setup(app):
    app.add_directive("course-launch", CourseLaunch)
    app.add_html_math_renderer("mathml", (lambda self, node: _mathml(self, node, False), None),
                               (lambda self, node: _mathml(self, node, True), None))
