from lapse.shell.app import main

main()
