"""The what-if explorer's building blocks (the scenario form, running and showing results, reading files); its pages are app/."""
