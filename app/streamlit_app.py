"""The what-if explorer's entry point: `streamlit run app/streamlit_app.py` (Explore, Compare, Validate, Sweep, Plan);
`streamlit run app/streamlit_app.py -- scenario.yaml` opens that scenario in the form."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from gpipe_app.ui_form import keep_form_state
from gpipe_app.ui_run import start_timer
from gpipe_app.ui_scenario import open_command_line_scenario

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
