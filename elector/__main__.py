from elector.cli.main import main

main()
