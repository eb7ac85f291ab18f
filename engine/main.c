#include <stdio.h>
int main(void){puts("moonloop");return 0;}
