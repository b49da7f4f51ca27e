"""The what-if explorer's entry point: `streamlit run app/streamlit_app.py` (Explore, Compare, Validate, Sweep, Plan);
`streamlit run app/streamlit_app.py -- scenario.yaml` opens that scenario in the form."""

from __future__ import annotations

import sys
from pathlib import Path

import streamlit as st

APP_DIR = Path(__file__).resolve().parent
if str(APP_DIR) not in sys.path:  # the views import the app's helper modules by name
    sys.path.insert(0, str(APP_DIR))

from ui_form import keep_form_state  # noqa: E402
from ui_run import start_timer  # noqa: E402
from ui_scenario import open_command_line_scenario  # noqa: E402

st.set_page_config(page_title="GPipe what-if", page_icon=":material/view_timeline:", layout="wide")
start_timer()
keep_form_state()
open_command_line_scenario(Path(__file__))  # once per session: the file after `--`, into the form
page = st.navigation([
    st.Page("views/explore.py", title="Explore", icon=":material/insights:", default=True),
    st.Page("views/compare.py", title="Compare", icon=":material/compare_arrows:"),
    st.Page("views/validate.py", title="Validate", icon=":material/fact_check:"),
    st.Page("views/sweep.py", title="Sweep", icon=":material/scatter_plot:"),
    st.Page("views/plan.py", title="Plan", icon=":material/travel_explore:"),
])
page.run()
