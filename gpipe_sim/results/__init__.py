"""Results: the schema shared by simulator and executor, and trace export."""
