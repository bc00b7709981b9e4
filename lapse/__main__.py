from lapse.cli import main

main()
