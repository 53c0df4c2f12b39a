// A deliberately misformatted file: the format_check_catches_violation test expects
// scripts/check_format.sh to fail on it, so the check is known to be able to fail.
int   main( ){return 0 ;}
