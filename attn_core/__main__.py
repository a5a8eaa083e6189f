from attn_core.cli import main

main()
