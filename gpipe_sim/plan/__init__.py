"""Planning: partition the layers, place chunks on ranks and devices, compile the program the engines run, account its memory."""
