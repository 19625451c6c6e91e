from elector.cli import main

main()
