from calibkit.cli import main

main()
