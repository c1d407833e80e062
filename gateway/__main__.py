from gateway.cli import console_main

console_main()
