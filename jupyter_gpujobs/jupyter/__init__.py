"""What runs inside a user's Jupyter server: the server extension (which hosts the engine or
forwards to the machine's shared one), the GPU kernel provisioner and its kernelspecs."""
